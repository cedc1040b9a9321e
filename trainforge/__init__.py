"""The user's side of trainforge: a Python SDK and the `trainforge` CLI.

Both speak only the REST API (import-linter keeps it that way), so they work
the same against the embedded stack on a laptop and a shared cluster.
"""

from trainforge.sdk import ApiError, Client, ClientError

__all__ = ["ApiError", "Client", "ClientError"]

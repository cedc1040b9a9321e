"""The platform's error hierarchy: every failure a client can see has a home here.

Services raise these; the gRPC layer maps them to status codes
(services/common/rpc.py) and the API maps them to HTTP responses once, in the
app factory. A message names what is wrong; it never carries a traceback.
"""

from __future__ import annotations


class TrainforgeError(Exception):
    """Base of all domain errors."""

    code = "internal"
    http_status = 500

    def __init__(self, message: str, *, details: list[dict] | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or []


class InvalidArgument(TrainforgeError):
    code = "invalid_argument"
    http_status = 422


class RefusedReference(InvalidArgument):
    """A job names something the platform will not reach for it (a requirement line that is an installer option
    or a local path, a webhook to the platform's own network). `refusals` ({field, source, rule}, never the
    referenced content) are what the API's audit log records of the request."""

    def __init__(self, message: str, *, refusals: list[dict], details: list[dict] | None = None):
        super().__init__(message, details=details)
        self.refusals = refusals


class NotFound(TrainforgeError):
    code = "not_found"
    http_status = 404


class Conflict(TrainforgeError):
    """The request is well-formed but the target's state forbids it."""

    code = "conflict"
    http_status = 409


class Unauthenticated(TrainforgeError):
    code = "unauthenticated"
    http_status = 401


class PermissionDenied(TrainforgeError):
    code = "permission_denied"
    http_status = 403


class ResourceExhausted(TrainforgeError):
    code = "resource_exhausted"
    http_status = 429


class Unavailable(TrainforgeError):
    """A backing service cannot be reached; retrying later may succeed."""

    code = "unavailable"
    http_status = 503


def message_of(error: BaseException) -> str:
    """What to log or record of `error`: a domain error's own message, else the exception's text, else its type's
    name (an exception raised without words still says what it was)."""
    if isinstance(error, TrainforgeError):
        return error.message
    return str(error) or type(error).__name__

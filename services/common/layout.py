"""The object-store key layout (docs/CONTRACTS.md, "Object store keys") shared by more than one service.

Keys, not URIs: a URI is `store://` + key (services.common.adapters.objectstore.SCHEME).
"""

from __future__ import annotations


def checkpoint_root(job_id: str) -> str:
    """The key prefix of a job's checkpoints: `jobs/<job>/checkpoints/<rank>/<step:012d>/...` lie under it."""
    return f"jobs/{job_id}/checkpoints/"

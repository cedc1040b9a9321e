"""What changes in a job's record when it starts over as its next attempt (resume or restart).

A redeploy always restores from the job's checkpoint root: the controllers
pick the newest step every learner stored (docs/CONTRACTS.md), so the Trainer
never needs to know which step that is.
"""

from __future__ import annotations

from services.common.contracts.storekeys import checkpoint_root, uri_for_prefix


def checkpoint_uri(job_id: str) -> str:
    """Where a job's learners store checkpoints (docs/CONTRACTS.md); a redeploy restores from here."""
    return uri_for_prefix(checkpoint_root(job_id))


def next_attempt(doc: dict, *, not_before: float = 0.0, resumed: bool = False) -> dict:
    """The fields that turn a job's record into its next attempt's (set with the move to QUEUED)."""
    return {"attempt": int(doc["attempt"]) + 1, "checkpoint_uri": checkpoint_uri(doc["_id"]),
            "not_before": not_before, "learners": {}, "resumed": resumed}

"""What changes in a job's record when it starts over as its next attempt (resume or restart).

A redeploy always restores from the job's checkpoint root: the controllers
pick the newest step every learner stored (docs/CONTRACTS.md), so the Trainer
never needs to know which step that is.
"""

from __future__ import annotations

from typing import Any

from trainforge_services.common.contracts.storekeys import checkpoint_root, uri_for_prefix
from trainforge_services.trainer.record import JobRecord


def checkpoint_uri(job_id: str) -> str:
    """Where a job's learners store checkpoints (docs/CONTRACTS.md); a redeploy restores from here."""
    return uri_for_prefix(checkpoint_root(job_id))


def next_attempt(job: JobRecord, *, not_before: float = 0.0, resumed: bool = False) -> dict[str, Any]:
    """The record fields that make `job` its next attempt (set with the move to QUEUED)."""
    return {"attempt": job.attempt + 1, "checkpoint_uri": checkpoint_uri(job.id),
            "not_before": not_before, "learners": {}, "resumed": resumed}

"""The lifecycle's memory of each job's current attempt, persisted so an LCM restart loses nothing.

`<state_dir>/lcm/jobs/<job>.json` holds the attempt's plan, whether it is
being removed (`killing`, set before anything is stopped, so an LCM that
crashes halfway never revives what it was removing; `redoing` when it is
removed only to launch the same attempt again, so it is not marked killed), which ranks' lost
controllers were already reported and, for an elastic attempt, how many
learners the Trainer granted it (`granted`; 0: only those it started with). Which processes run is the backend's
business, not recorded here.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from trainforge_services.lcm.backends.base import AttemptPlan
from trainforge_services.lcm.store import RecordStore


class AttemptRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    plan: AttemptPlan
    killing: bool = False
    redoing: bool = False
    reported_dead: tuple[int, ...] = ()
    granted: int = 0
    created_at: float = Field(default_factory=time.time)

    @property
    def job_id(self) -> str:
        return self.plan.job_id

    @property
    def attempt(self) -> int:
        return self.plan.attempt


def attempt_records(state_dir: Path) -> RecordStore[AttemptRecord]:
    return RecordStore(state_dir / "lcm" / "jobs", AttemptRecord, lambda r: r.job_id)

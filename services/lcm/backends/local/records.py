"""The local backend's own memory: which processes it started for a job, persisted.

`<state_dir>/lcm/local/<job>.json` holds pids and their start times per
handle, written atomically (`trainforge_services.lcm.store`) after every process started, so an LCM that
restarts finds the processes the previous one left running (and a pid that
was reused since is never taken for ours). Everything else about the attempt
(the plan, whether it is being killed, which lost controllers were reported)
is the lifecycle's record, not this one.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from trainforge_services.lcm.backends.base import Handle, Role
from trainforge_services.lcm.store import RecordStore


class ProcessEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Role
    rank: int | None = None
    pid: int
    started: float

    @property
    def handle(self) -> Handle:
        return Handle(role=self.role, ref=str(self.pid), rank=self.rank)


class ProcessRecord(BaseModel):
    """The processes of one job's current attempt, in the order they were started."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    attempt: int
    attempt_dir: Path
    processes: tuple[ProcessEntry, ...] = ()

    def adding(self, entry: ProcessEntry) -> ProcessRecord:
        return self.model_copy(update={"processes": (*self.processes, entry)})

    def without_controller(self, rank: int) -> ProcessRecord:
        """Without the controller of `rank` (its slot of an elastic job is started again)."""
        return self.model_copy(update={"processes": tuple(
            e for e in self.processes if not (e.role is Role.CONTROLLER and e.rank == rank))})

    def without(self, role: Role) -> ProcessRecord:
        return self.model_copy(update={"processes": tuple(e for e in self.processes if e.role is not role)})


def process_records(state_dir: Path) -> RecordStore[ProcessRecord]:
    records = RecordStore(state_dir / "lcm" / "local", ProcessRecord, lambda r: r.job_id)
    records.load()
    return records

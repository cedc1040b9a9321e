"""The local backend's own memory: which processes it started for a job, persisted.

`<state_dir>/lcm/local/<job>.json` holds pids and their start times per
handle, written atomically after every process started, so an LCM that
restarts finds the processes the previous one left running (and a pid that
was reused since is never taken for ours). Everything else about the attempt
(the plan, whether it is being killed, which lost controllers were reported)
is the lifecycle's record, not this one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from services.lcm.backends.base import Handle, Role

log = logging.getLogger(__name__)


def write_json(path: Path, text: str) -> None:
    """Replace path atomically: a reader (or a crash) sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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

    def without(self, role: Role) -> ProcessRecord:
        return self.model_copy(update={"processes": tuple(e for e in self.processes if e.role is not role)})


class ProcessRecords:
    """ProcessRecord files in one directory, cached in memory; callers serialise per job."""

    def __init__(self, directory: Path):
        self._dir = directory
        self._lock = threading.Lock()
        self._cache: dict[str, ProcessRecord] = {}
        self._load()

    def _path(self, job_id: str) -> Path:
        return self._dir / f"{job_id}.json"

    def _load(self) -> None:
        if not self._dir.is_dir():
            return
        for path in sorted(self._dir.glob("*.json")):
            try:
                record = ProcessRecord.model_validate(json.loads(path.read_text()))
            except (OSError, ValueError, ValidationError) as e:
                log.warning("ignoring unreadable process record %s: %s", path, e)
                continue
            self._cache[record.job_id] = record

    def get(self, job_id: str) -> ProcessRecord | None:
        with self._lock:
            return self._cache.get(job_id)

    def put(self, record: ProcessRecord) -> None:
        with self._lock:
            write_json(self._path(record.job_id), record.model_dump_json(indent=2))
            self._cache[record.job_id] = record

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._cache.pop(job_id, None)
            self._path(job_id).unlink(missing_ok=True)

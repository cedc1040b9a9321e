"""The lifecycle's memory of each job's current attempt, persisted so an LCM restart loses nothing.

`<state_dir>/lcm/jobs/<job>.json` holds the attempt's plan, whether it is
being removed (`killing`, set before anything is stopped, so an LCM that
crashes halfway never revives what it was removing) and which ranks' lost
controllers were already reported. Written atomically: a reader (or a
crash) sees the old file or the new one. Which processes run is the
backend's business, not recorded here.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.lcm.backends.base import AttemptPlan

log = logging.getLogger(__name__)


class AttemptRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    plan: AttemptPlan
    killing: bool = False
    reported_dead: tuple[int, ...] = ()
    created_at: float = Field(default_factory=time.time)

    @property
    def job_id(self) -> str:
        return self.plan.job_id

    @property
    def attempt(self) -> int:
        return self.plan.attempt


class AttemptRecords:
    """AttemptRecord files in one directory, cached in memory (thread-safe)."""

    def __init__(self, directory: Path):
        self._dir = directory
        self._lock = threading.Lock()
        self._cache: dict[str, AttemptRecord] = {}

    def _path(self, job_id: str) -> Path:
        return self._dir / f"{job_id}.json"

    def load(self) -> list[AttemptRecord]:
        """Read every record a previous LCM left (unreadable ones are skipped with a warning)."""
        out = []
        if self._dir.is_dir():
            for path in sorted(self._dir.glob("*.json")):
                try:
                    record = AttemptRecord.model_validate(json.loads(path.read_text()))
                except (OSError, ValueError, ValidationError) as e:
                    log.warning("ignoring unreadable deployment record %s: %s", path, e)
                    continue
                with self._lock:
                    self._cache[record.job_id] = record
                out.append(record)
        return out

    def get(self, job_id: str) -> AttemptRecord | None:
        with self._lock:
            return self._cache.get(job_id)

    def all(self) -> list[AttemptRecord]:
        with self._lock:
            return list(self._cache.values())

    def put(self, record: AttemptRecord) -> AttemptRecord:
        with self._lock:
            self._dir.mkdir(parents=True, exist_ok=True)
            path = self._path(record.job_id)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(record.model_dump_json(indent=2))
            os.replace(tmp, path)
            self._cache[record.job_id] = record
        return record

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._cache.pop(job_id, None)
            self._path(job_id).unlink(missing_ok=True)

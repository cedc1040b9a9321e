"""Per-job JSON records that must survive an LCM restart: one file each, written atomically.

Both the lifecycle (its attempt records) and the local backend (the
processes it started) keep one; neither sees the other's. A reader, or a
crash, sees a record's old file or its new one, never half of either.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)
T = TypeVar("T", bound=BaseModel)


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    # created with its final mode, so a private file is never readable by others, not even briefly
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)  # the umask may have taken bits away; a private file stays private either way
    os.replace(tmp, path)


class RecordStore(Generic[T]):
    """`<directory>/<job>.json` per job, cached in memory; thread-safe (callers serialise per job)."""

    def __init__(self, directory: Path, model: type[T], job_of: Callable[[T], str]):
        self._dir = directory
        self._model = model
        self._job_of = job_of
        self._lock = threading.Lock()
        self._cache: dict[str, T] = {}

    def _path(self, job_id: str) -> Path:
        return self._dir / f"{job_id}.json"

    def load(self) -> list[T]:
        """Read every record on disk (unreadable ones are skipped with a warning)."""
        out = []
        for path in sorted(self._dir.glob("*.json")) if self._dir.is_dir() else ():
            try:
                record = self._model.model_validate(json.loads(path.read_text()))
            except (OSError, ValueError, ValidationError) as e:
                log.warning("ignoring unreadable record %s: %s", path, e)
                continue
            with self._lock:
                self._cache[self._job_of(record)] = record
            out.append(record)
        return out

    def get(self, job_id: str) -> T | None:
        with self._lock:
            return self._cache.get(job_id)

    def all(self) -> list[T]:
        with self._lock:
            return list(self._cache.values())

    def put(self, record: T) -> T:
        job_id = self._job_of(record)
        with self._lock:
            write_atomically(self._path(job_id), record.model_dump_json(indent=2))
            self._cache[job_id] = record
        return record

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._cache.pop(job_id, None)
            self._path(job_id).unlink(missing_ok=True)

"""A short-lived per-process cache of job reads, so a hot GET /v1/jobs/{id} does not cross two more processes.

Without it every GET is a gRPC call to the Trainer and a `find_one` in the
store behind it. `CachingTrainer` wraps the API's `TrainerApi`: `get_job_json`
(the body of GET /v1/jobs/{id}, and nothing else) answers from an entry
fetched at most `ttl` seconds ago (≤ 1 s, the same bound and rules as the
authentication cache, services/api/authcache.py):

- Entries are keyed by (team, job id), the pair the Trainer is asked with,
  so a hit is exactly the answer the Trainer gave that team; another team
  asking for the id misses and gets the Trainer's 404. Failures (no such
  job, Trainer unavailable) are never cached.
- An entry's time is taken *before* the Trainer is asked, so what a hit
  returns is never older than `ttl` compared with a read of the store at
  that moment: a change made by the Trainer, the LCM's reports or another
  API replica is seen within `ttl`.
- A write through this process (submit, cancel, halt, resume) stores the job
  it returns, so this replica's own writes are read back at once.
- The entry also keeps the response body rendered once (`json`), so a hit
  skips the response model's validation and serialisation.

Authentication, tenancy and the rate limit are untouched: they run before
the route asks this cache, on every request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.common.errors import InvalidArgument

MAX_TTL = 1.0
# Bound on entries: a cache full of distinct jobs is simply emptied (the next reads go to the Trainer).
MAX_ENTRIES = 10_000


@dataclass
class _Entry:
    job: dict
    fetched_at: float  # time.monotonic() taken before the Trainer was asked
    body: bytes | None = None  # the rendered response, made on the first hit that wants it


class CachingTrainer:
    """A `TrainerApi` whose `get_job` is cached for `ttl` seconds; every other call goes straight through."""

    def __init__(self, trainer: TrainerApi, ttl: float, render: Callable[[dict], bytes] | None = None):
        if not 0 < ttl <= MAX_TTL:
            raise InvalidArgument(f"job cache ttl {ttl} must be above 0 and at most {MAX_TTL} seconds",
                                  details=[{"field": "job_cache_seconds", "message": f"above 0, at most {MAX_TTL}"}])
        self.inner = trainer
        self.ttl = ttl
        self._render = render
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # list_jobs, set_quota, health, close, ...: not cached
        return getattr(self.inner, name)

    # -- reads -------------------------------------------------------------------

    def _entry(self, team: str, job_id: str) -> _Entry:
        key = (team, job_id)
        entry = self._entries.get(key)
        if entry is not None and time.monotonic() - entry.fetched_at < self.ttl:
            return entry
        fetched_at = time.monotonic()
        job = self.inner.get_job(team, job_id)  # raises NotFound etc.: nothing is stored
        return self._store(key, job, fetched_at)

    def get_job(self, team: str, job_id: str) -> dict:
        """Straight from the Trainer: only GET /v1/jobs/{id} (`get_job_json`) reads through the cache, so the
        routes that decide on a job's state (logs from the index or the archives, outputs) see it fresh."""
        return self.inner.get_job(team, job_id)

    def get_job_json(self, team: str, job_id: str) -> bytes:
        """The job as the route's response body (rendered with `render`, once per entry)."""
        if self._render is None:
            raise RuntimeError("CachingTrainer was built without a renderer")
        entry = self._entry(team, job_id)
        body = entry.body
        if body is None:
            body = entry.body = self._render(entry.job)
        return body

    # -- writes: what this process changed is read back at once ----------------------

    def _store(self, key: tuple[str, str], job: dict, fetched_at: float) -> _Entry:
        entry = _Entry(job, fetched_at)
        with self._lock:
            current = self._entries.get(key)
            if current is not None and current.fetched_at > fetched_at:
                return current  # a newer read or write landed meanwhile; keep it
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = entry
        return entry

    def _written(self, team: str, job_id: str, call: Callable[[], dict]) -> dict:
        fetched_at = time.monotonic()
        try:
            job = call()
        except BaseException:
            self.forget(team, job_id)  # the write may have happened anyway (a timeout): read it fresh next time
            raise
        self._store((team, job["id"]), job, fetched_at)
        return job

    def forget(self, team: str, job_id: str | None = None) -> None:
        """Drop the entries of a job (or of every job of a team) in this process."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == team and job_id in (None, k[1])]:
                del self._entries[key]

    def submit_job(self, *, team: str, manifest_json: str, code_uri: str, submitted_by: str, job_id: str) -> dict:
        return self._written(team, job_id, lambda: self.inner.submit_job(
            team=team, manifest_json=manifest_json, code_uri=code_uri, submitted_by=submitted_by, job_id=job_id))

    def cancel_job(self, team: str, job_id: str, *, actor: str) -> dict:
        return self._written(team, job_id, lambda: self.inner.cancel_job(team, job_id, actor=actor))

    def halt_job(self, team: str, job_id: str, *, actor: str) -> dict:
        return self._written(team, job_id, lambda: self.inner.halt_job(team, job_id, actor=actor))

    def resume_job(self, team: str, job_id: str, *, actor: str) -> dict:
        return self._written(team, job_id, lambda: self.inner.resume_job(team, job_id, actor=actor))

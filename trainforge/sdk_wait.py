"""Following jobs until they rest, for the SDK's `Client` (a mixin): `wait` for one job, `wait_all` for many,
and `list_changed`, the listing of what changed that `wait_all` polls.

Kept apart from `sdk.py` for size; every call runs through the client's own
`get` and `_request`, so retries, the key and the error mapping are the client's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from trainforge.sdk_base import RESTING_STATES, WaitTimeout, state_names


def _next_poll(deadline: float | None, poll_interval: float) -> bool:
    """Sleep until the next poll (never past `deadline`); False, without sleeping, once `deadline` has passed."""
    if deadline is None:
        time.sleep(poll_interval)
        return True
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    time.sleep(min(poll_interval, left))
    return True


class WaitMixin:
    """Calls that follow jobs until they rest; mixed into `trainforge.sdk.Client`."""

    def list_changed(self, since: float | None = None, *, state: str | list[str] | None = None,
                     page_size: int = 1000, retry_seconds: float | None = None) -> tuple[list[dict], float]:
        """(jobs, as_of): the team's jobs changed at or after `since` (unix seconds; None: every job), all
        pages of them, and the time to pass as `since` next. `state`: only jobs now in it (one or a list),
        e.g. the end states, for a follower that waits for jobs to end and need not read every step.

        `as_of` is the first page's: the server took it before that page's read, so a change that committed
        during or after the listing is in the next one. A job may come back in two listings, never be
        missed. A change is a submit, a move to another state or new fields; a waiting job's new queue
        reason or position is not one (`wait` polls the job itself for those)."""
        params: dict[str, Any] = {"limit": page_size}
        if since is not None:
            params["changed_since"] = since
        if state:
            params["state"] = state_names(state)
        jobs: list[dict] = []
        as_of: float | None = None
        cursor = None
        while True:
            page = self._request("GET", "/v1/jobs", params={**params, **({"cursor": cursor} if cursor else {})},
                                 retry_seconds=retry_seconds)
            jobs += page["jobs"]
            if as_of is None:
                # an API from before changed_since answers none: the same `since` again misses nothing
                as_of = page.get("as_of") or since or 0.0
            cursor = page.get("next_cursor")
            if not cursor:
                return jobs, as_of

    def wait(self, job_id: str, timeout: float | None = None, on_change: Callable[[dict], None] | None = None,
             poll_interval: float = 1.0) -> dict:
        """Poll until the job ends or is halted and return it; on_change(job) on every change of state,
        reason, queue position or learner states. Raises WaitTimeout after `timeout` seconds. An API
        that is down or restarting is waited for (reconnect_seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = None
        while True:
            job = self.get(job_id, retry_seconds=self.reconnect_seconds)
            now = (job["state"], job["reason"], job["queue_position"],
                   tuple(ln["state"] for ln in job.get("learners", [])))
            if now != seen:
                seen = now
                if on_change is not None:
                    on_change(job)
            if job["state"] in RESTING_STATES:
                return job
            if not _next_poll(deadline, poll_interval):
                raise WaitTimeout(f"job {job_id} is still {job['state']} after {timeout}s")

    def wait_all(self, job_ids: Iterable[str], timeout: float | None = None, poll_interval: float = 1.0,
                 on_change: Callable[[dict], None] | None = None) -> list[dict]:
        """Follow many jobs until each has ended or is halted (as `wait` does one) and return them in the
        order of `job_ids`; on_change(job) for each job whose state a listing showed changed.

        One listing of the team's jobs first, then only what changed since the previous listing
        (`list_changed`), so each poll reads the few jobs that moved, not all of them again. A job the first
        listing lacks is read by id (an unknown id raises the API's 404). Raises WaitTimeout after `timeout`
        seconds; an API that is down or restarting is waited for (reconnect_seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wanted = list(dict.fromkeys(job_ids))
        wanted_set = set(wanted)
        latest: dict[str, dict] = {}
        since: float | None = None
        while True:
            jobs, as_of = self.list_changed(since, retry_seconds=self.reconnect_seconds)
            for job in jobs:
                if job["id"] not in wanted_set:
                    continue
                if on_change is not None and latest.get(job["id"], {}).get("state") != job["state"]:
                    on_change(job)
                latest[job["id"]] = job
            if since is None:
                for job_id in wanted:
                    if job_id not in latest:
                        latest[job_id] = self.get(job_id, retry_seconds=self.reconnect_seconds)
            since = as_of
            waiting = [job_id for job_id in wanted if latest[job_id]["state"] not in RESTING_STATES]
            if not waiting:
                return [latest[job_id] for job_id in wanted]
            if not _next_poll(deadline, poll_interval):
                states = sorted({latest[job_id]["state"] for job_id in waiting})
                raise WaitTimeout(f"{len(waiting)} of {len(wanted)} jobs still {', '.join(states)} after "
                                  f"{timeout}s (e.g. {waiting[0]})")


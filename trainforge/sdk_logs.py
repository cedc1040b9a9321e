"""The log, metric and event reads of the SDK's `Client` (a mixin): pages, streams, raw archives, follow.

Kept apart from `sdk.py` only for size; every method runs through the
client's own `_request` / `_http`, so retries, the key and the error
mapping are the client's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from trainforge.sdk_base import RESTING_STATES, ApiError, _error_from


class LogsMixin:
    """Log, metric and event calls; mixed into `trainforge.sdk.Client`."""


    def logs_page(self, job_id: str, *, learner: int | None = None, after: str | None = None,
                  limit: int | None = None, query: str | None = None, retry_seconds: float | None = None) -> dict:
        """One page: {"lines", "next", "job_state"}."""
        params: dict[str, Any] = {}
        if learner is not None:
            params["learner"] = learner
        if after:
            params["after"] = after
        if limit is not None:
            params["limit"] = limit
        if query:
            params["q"] = query
        return self._request("GET", f"/v1/jobs/{job_id}/logs", params=params, retry_seconds=retry_seconds)

    def logs(self, job_id: str, learner: int | None = None, after: str | None = None,
             limit: int | None = None, query: str | None = None) -> tuple[list[dict], str]:
        """(lines, next): pass next back as `after` for the lines that follow."""
        page = self.logs_page(job_id, learner=learner, after=after, limit=limit, query=query)
        return page["lines"], page["next"]

    def _stream(self, path: str, params: dict[str, Any]) -> Iterator[httpx.Response]:
        try:
            with self._http.stream("GET", path, params=params, timeout=httpx.Timeout(self._http.timeout.connect,
                                                                                      read=300.0)) as resp:
                if not resp.is_success:
                    resp.read()
                    raise _error_from(resp)
                yield resp
        except httpx.TimeoutException as e:
            raise ApiError(0, "timeout", f"the trainforge API at {self.api_url} did not answer in time ({e})") from None
        except httpx.HTTPError as e:
            raise ApiError(0, "unavailable", f"cannot reach the trainforge API at {self.api_url} ({e})") from None

    def stream_log_lines(self, job_id: str, learner: int | None = None) -> Iterator[bytes]:
        """Every line of a job as JSON-line bytes, in order (a settled job's come from its archives: all of them)."""
        params = {"learner": learner} if learner is not None else {}
        for resp in self._stream(f"/v1/jobs/{job_id}/logs/stream", params):
            rest = b""
            for chunk in resp.iter_bytes(1 << 16):
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                yield from lines
            if rest:
                yield rest

    def stream_logs(self, job_id: str, learner: int | None = None) -> Iterator[dict]:
        """Every line of a job as a dict, in order."""
        for raw in self.stream_log_lines(job_id, learner):
            if raw:
                yield json.loads(raw)

    def download_log(self, job_id: str, path: str | Path, learner: int = 0, attempt: int | None = None) -> int:
        """Save one learner's raw log archive (its latest attempt unless given); returns the bytes written."""
        params: dict[str, Any] = {"learner": learner}
        if attempt is not None:
            params["attempt"] = attempt
        written = 0
        with open(path, "wb") as f:
            for resp in self._stream(f"/v1/jobs/{job_id}/logs/raw", params):
                for chunk in resp.iter_bytes():
                    f.write(chunk)
                    written += len(chunk)
        return written

    def metrics(self, job_id: str, names: list[str] | None = None) -> dict:
        """{"series": {name: [{step, value, ts, learner, attempt}]}, "last": {...}, "progress": {...}}."""
        params = {"name": ",".join(names)} if names else {}
        return self._request("GET", f"/v1/jobs/{job_id}/metrics", params=params)

    def events(self, job_id: str) -> list[dict]:
        """The job's timeline: [{time, kind, from, to, reason, actor}]."""
        return self._request("GET", f"/v1/jobs/{job_id}/events")["events"]

    def follow_logs(self, job_id: str, learner: int | None = None, after: str | None = None, *,
                    query: str | None = None, poll_interval: float = 1.0,
                    on_state: Callable[[str], None] | None = None) -> Iterator[dict]:
        """Yield a job's lines as they arrive until the job ended and no lines remain.

        on_state(state) is called whenever the job's state differs from the last page's. An API that
        is down or restarting is waited for (reconnect_seconds); the cursor makes sure no line is
        lost or repeated across the gap.
        """
        cursor, last_state, drained = after, None, False
        while True:
            page = self.logs_page(job_id, learner=learner, after=cursor, query=query,
                                  retry_seconds=self.reconnect_seconds)
            cursor = page["next"] or cursor
            if page["job_state"] != last_state:
                last_state = page["job_state"]
                if on_state is not None:
                    on_state(last_state)
            yield from page["lines"]
            if page["lines"]:
                continue
            if last_state in RESTING_STATES:
                if drained:
                    return
                # Lines a learner shipped just before the end may still be on their way.
                drained = True
            time.sleep(poll_interval)

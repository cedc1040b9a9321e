"""The Python SDK: everything a user does with trainforge, over the REST API.

`Client` is a thin, synchronous layer over httpx that turns every failure
into one exception type, `ApiError`, whose message is fit to show a user
as it is (the server's message already names the bad fields). Submitting
packs the manifest's `code:` folder (honouring .gitignore and
.trainforgeignore, trainforge/packing.py) into a temporary file and streams
it; following a job is plain polling, which works through any proxy.

Transient failures are retried with exponential backoff (tenacity): a
connection that was never made, for every call (nothing reached the
server); a 5xx or a timeout only for calls that are safe to repeat (reads,
and a submit that carries an Idempotency-Key). `follow_logs` and `wait`
keep going through an API restart for `reconnect_seconds`.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import tenacity

from trainforge import models, packing, uploads
from trainforge.sdk_base import (  # noqa: F401 - the SDK's public names, re-exported
    RESTING_STATES,
    TERMINAL_STATES,
    ApiError,
    ClientError,
    NotConnected,
    WaitTimeout,
    When,
    _error_from,
    state_names,
    time_filters,
)
from trainforge.sdk_logs import LogsMixin
from trainforge.sdk_wait import WaitMixin

if TYPE_CHECKING:
    from trainforge.results import Results
    from trainforge.sdk_admin import Admin
    from trainforge.sdk_experiments import Experiments, Workflows
    from trainforge.team_secrets import Secrets

# Times one request is retried after a 429 (too many requests) before the error is raised.
RATE_LIMIT_RETRIES = 5

# Answers that mean "try again shortly": the API or a store behind it restarting.
TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})


def _retry_after(state: tenacity.RetryCallState) -> float:
    """The wait a 429 asks for (Retry-After, seconds), within [0.05, 10]; 1 when it asks for none."""
    resp = state.outcome.result() if state.outcome else None
    try:
        wait = float(resp.headers.get("Retry-After", "1")) if resp is not None else 1.0
    except ValueError:
        wait = 1.0
    return min(max(wait, 0.05), 10.0)


def pack_code(directory: str | Path) -> bytes:
    """A folder as a gzip tar in memory (small folders, tests); `submit` streams from a temporary file."""
    try:
        code = packing.list_code(directory)
    except packing.PackError as e:
        raise ClientError(str(e)) from None
    buf = io.BytesIO()
    packing.pack_to_file(code, buf)
    return buf.getvalue()


def _retryable(safe: bool) -> Callable[[BaseException], bool]:
    def check(e: BaseException) -> bool:
        if isinstance(e, NotConnected):
            return True
        return safe and isinstance(e, ApiError) and (e.status == 0 or e.status in TRANSIENT_STATUSES)
    return check


class Client(LogsMixin, WaitMixin):
    """A session with the trainforge API as one API key (one team)."""

    def __init__(self, api_url: str, api_key: str, timeout: float = 30.0, *,
                 transport: httpx.BaseTransport | None = None, retry_seconds: float = 10.0,
                 reconnect_seconds: float = 300.0):
        """retry_seconds: how long one call retries transient failures; reconnect_seconds: how long
        `follow_logs` and `wait` wait out an API that is down or restarting."""
        if not api_url:
            raise ClientError("no API URL configured; run `trainforge up` or set TRAINFORGE_API_URL")
        self.api_url = api_url.rstrip("/")
        self.retry_seconds, self.reconnect_seconds = retry_seconds, reconnect_seconds
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.api_url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------

    def _request(self, method: str, path: str, *, idempotent: bool | None = None,
                 retry_seconds: float | None = None, before: Callable[[], None] | None = None,
                 **kwargs: Any) -> Any:
        """One call, retried on transient failures (the module's docstring says which).

        idempotent: whether repeating the call is safe (default: GET and HEAD are); before(): run
        before every attempt (rewinding an upload).
        """
        safe = method in ("GET", "HEAD") if idempotent is None else idempotent
        budget = self.retry_seconds if retry_seconds is None else retry_seconds

        def attempt() -> Any:
            if before is not None:
                before()
            return self._request_once(method, path, **kwargs)

        if budget <= 0:
            return attempt()
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retryable(safe)),
            wait=tenacity.wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2),
            stop=tenacity.stop_after_delay(budget), reraise=True, sleep=lambda seconds: time.sleep(seconds))
        return retrying(attempt)

    def _request_once(self, method: str, path: str, **kwargs: Any) -> Any:
        # A 429 is answered before the route runs, so waiting out its Retry-After and
        # asking again is safe for every method; a client that keeps hitting it gets the error
        # (the last 429 is returned, not a RetryError). Errors of _send are never retried.
        as_text = kwargs.pop("as_text", False)  # a body that is not JSON (the usage CSV)
        rate_limited = tenacity.Retrying(
            retry=tenacity.retry_if_result(lambda r: r.status_code == 429), wait=_retry_after,
            stop=tenacity.stop_after_attempt(RATE_LIMIT_RETRIES),
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
            sleep=lambda seconds: time.sleep(seconds))
        resp: httpx.Response = rate_limited(self._send, method, path, **kwargs)
        if resp.is_success:
            return resp.text if as_text else resp.json()
        raise _error_from(resp)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.ConnectError as e:
            raise NotConnected(0, "unavailable", f"cannot reach the trainforge API at {self.api_url} ({e}); "
                                                 "is the stack running? try `trainforge up`") from None
        except httpx.TimeoutException as e:
            raise ApiError(0, "timeout", f"the trainforge API at {self.api_url} did not answer in time ({e})") from None
        except httpx.HTTPError as e:
            raise ApiError(0, "unavailable", f"cannot reach the trainforge API at {self.api_url} ({e}); "
                                             "is the stack running? try `trainforge up`") from None

    # -- jobs -----------------------------------------------------------------

    def submit(self, manifest: str | Path | dict, code_dir: str | Path | None = None,
               idempotency_key: str | None = None, *, params: dict[str, Any] | None = None,
               env: dict[str, str] | None = None, max_upload_bytes: int = packing.DEFAULT_MAX_BYTES,
               on_code: Callable[[packing.CodeFiles], None] | None = None,
               on_upload: Callable[[int, int], None] | None = None) -> dict:
        """Submit a job from a manifest file (or dict); its `code:` folder is packed and uploaded.

        code_dir overrides the manifest's `code:`. A relative `code:` is taken relative to the
        manifest file, or to the current directory for a dict. params/env are merged over the
        manifest's. A folder whose files add up to more than max_upload_bytes is refused before
        anything is sent. on_code(files) once the files are listed; on_upload(sent, archive_size) as
        each chunk is sent.
        Only a submit with an idempotency_key is retried after a 5xx or a timeout.
        """
        if isinstance(manifest, dict):
            text, base = json.dumps(manifest), Path.cwd()
        else:
            path = Path(manifest)
            try:
                text = path.read_text()
            except OSError as e:
                raise ClientError(f"cannot read manifest {path}: {e.strerror or e}") from None
            base = path.resolve().parent
        folder = Path(code_dir) if code_dir is not None else uploads.code_dir_of(text, base)
        text = uploads.with_overrides(text, params, env)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        kwargs: dict[str, Any] = {"idempotent": bool(idempotency_key), "data": {"manifest": text},
                                  "headers": headers}
        if folder is None:
            return self._request("POST", "/v1/jobs", **kwargs)
        try:
            code = packing.code_to_send(folder, max_upload_bytes)
        except packing.PackError as e:
            raise ClientError(str(e)) from None
        if on_code is not None:
            on_code(code)
        with packing.temporary_archive(code) as archive:
            size = os.fstat(archive.fileno()).st_size
            upload = uploads.ProgressReader(archive, None if on_upload is None else lambda n: on_upload(n, size))
            return self._request("POST", "/v1/jobs", files={"code": ("code.tar.gz", upload, "application/gzip")},
                                 before=lambda: archive.seek(0), **kwargs)

    def get(self, job_id: str, *, retry_seconds: float | None = None) -> dict:
        return self._request("GET", f"/v1/jobs/{job_id}", retry_seconds=retry_seconds)

    def list(self, state: str | list[str] | None = None, limit: int = 50,
             label: str | list[str] | None = None, *, name: str | None = None, since: When = None,
             until: When = None, cursor: str | None = None) -> list[dict]:
        """The team's jobs, newest first (one page: `list_page` also gives the next page's cursor).

        label: "key=value" (several: all must match); since/until: the creation time, a datetime,
        ISO-8601 text or unix seconds (since inclusive, until exclusive).
        """
        return self.list_page(state, limit, label, name=name, since=since, until=until, cursor=cursor)["jobs"]

    def list_page(self, state: str | list[str] | None = None, limit: int = 50,
                  label: str | list[str] | None = None, *, name: str | None = None, since: When = None,
                  until: When = None, cursor: str | None = None) -> dict:
        """One page as the API sends it: {"jobs": [...], "next_cursor": the next page's cursor, None on the last}."""
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state_names(state)
        if label:
            params["label"] = [label] if isinstance(label, str) else list(label)
        params.update(time_filters(since=since, until=until))
        if name:
            params["name"] = name
        if cursor:
            params["cursor"] = cursor
        page = self._request("GET", "/v1/jobs", params=params)
        return {"jobs": page["jobs"], "next_cursor": page.get("next_cursor")}

    def iter_jobs(self, state: str | list[str] | None = None, label: str | list[str] | None = None, *,
                  name: str | None = None, since: When = None, until: When = None,
                  page_size: int = 100) -> Iterator[dict]:
        """Every matching job, newest first, following the pages' cursors."""
        cursor = None
        while True:
            page = self.list_page(state, page_size, label, name=name, since=since, until=until, cursor=cursor)
            yield from page["jobs"]
            cursor = page["next_cursor"]
            if not cursor:
                return

    def cancel(self, job_id: str) -> dict:
        return self._request("POST", f"/v1/jobs/{job_id}/cancel")

    def halt(self, job_id: str) -> dict:
        """Ask a running job to checkpoint and stop; it is halting, then halted (see `wait`)."""
        return self._request("POST", f"/v1/jobs/{job_id}/halt")

    def resume(self, job_id: str) -> dict:
        """Queue a halted job again; it continues from its checkpoint as its next attempt."""
        return self._request("POST", f"/v1/jobs/{job_id}/resume")

    def health(self) -> dict:
        """The API's /healthz body; raises ApiError when a component is down."""
        return self._request("GET", "/healthz")

    # -- identity, the team's keys and usage ----------------------------------------

    def whoami(self) -> dict:
        """{team, key_id, role, via} of this client's key or token."""
        return self._request("GET", "/v1/auth/me")

    def token(self) -> dict:
        """Exchange this client's API key for a short-lived JWT: {token, token_type, expires_at, expires_in}."""
        return self._request("POST", "/v1/auth/token")

    def usage(self) -> dict:
        """The team's quota, what its active jobs hold, its queue and what it consumed."""
        return self._request("GET", "/v1/team/usage")

    def published(self) -> list[dict]:
        """Object-store prefixes published to the team, which its jobs may read besides its own objects."""
        return self._request("GET", "/v1/team/published")["publications"]

    def keys(self) -> list[dict]:
        """The team's API keys, never their secrets (team admins)."""
        return self._request("GET", "/v1/team/keys")["keys"]

    def create_key(self, name: str, role: str = "member", expires_at: dt.datetime | str | None = None) -> dict:
        """A new key of the team (team admins); its plaintext is in "key", shown only this once."""
        return self._request("POST", "/v1/team/keys", json=key_body(name, role, expires_at))

    def revoke_key(self, key_id: str) -> dict:
        """Revoke one of the team's keys (team admins); effective from the next request."""
        return self._request("DELETE", f"/v1/team/keys/{key_id}")

    @property
    def typed(self) -> models.Typed:
        """These calls with typed results (trainforge/models.py)."""
        return models.Typed(self)

    @property
    def admin(self) -> Admin:
        """Platform-admin operations (every team, quotas, usage, keys, the audit log; trainforge.sdk_admin)."""
        from trainforge.sdk_admin import Admin

        return Admin(self)

    @property
    def results(self) -> Results:
        """A job's outputs and checkpoints: listings and verified downloads (trainforge.results)."""
        from trainforge.results import Results

        return Results(self)

    @property
    def experiments(self) -> Experiments:
        """Parameter sweeps: submit a recipe, list, get with trials, halt, resume, cancel (trainforge.sdk_experiments)."""
        from trainforge.sdk_experiments import Experiments

        return Experiments(self)

    @property
    def workflows(self) -> Workflows:
        """DAGs of experiments: submit, list, get with nodes, cancel (trainforge.sdk_experiments)."""
        from trainforge.sdk_experiments import Workflows

        return Workflows(self)

    @property
    def secrets(self) -> Secrets:
        """The team's secrets: set, list (names only), delete (trainforge.team_secrets)."""
        from trainforge.team_secrets import Secrets

        return Secrets(self)


def key_body(name: str, role: str, expires_at: dt.datetime | str | None) -> dict:
    body: dict[str, Any] = {"name": name, "role": role}
    if expires_at is not None:
        body["expires_at"] = expires_at.isoformat() if isinstance(expires_at, dt.datetime) else expires_at
    return body

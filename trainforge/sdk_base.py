"""The SDK's errors and the job states it waits on: shared by `sdk.py` and its parts (`sdk_logs.py`,
`sdk_wait.py`).

Import them from `trainforge.sdk` (or `trainforge`), which re-exports them.
"""

from __future__ import annotations

import datetime as dt

import httpx

# A time filter as the API takes it: a datetime, ISO-8601 text or unix seconds.
When = dt.datetime | str | float | None

TERMINAL_STATES = frozenset({"completed", "failed", "cancelled"})
# Where a job stays until someone acts: the end, or halted (until resumed).
RESTING_STATES = TERMINAL_STATES | {"halted"}


class ClientError(Exception):
    """Anything that went wrong on the way to or from the API."""


class ApiError(ClientError):
    """The API refused a request, or could not be reached (status 0)."""

    def __init__(self, status: int, code: str, message: str, details: list[dict] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []

    def __str__(self) -> str:
        text = self.message
        missing = [d for d in self.details if d.get("field") and d["field"] not in text]
        if missing:
            text += " (" + "; ".join(f"{d['field']}: {d.get('message', '')}" for d in missing) + ")"
        if self.status:
            text += f" [HTTP {self.status} {self.code.replace('_', ' ')}]"
        return text


class NotConnected(ApiError):
    """No connection to the API could be made: the request never reached it, so repeating it is safe."""


class WaitTimeout(ClientError):
    """`Client.wait` gave up before the job ended."""


def _error_from(resp: httpx.Response) -> ApiError:
    try:
        body = resp.json()
        err = body["error"]
        return ApiError(resp.status_code, str(err.get("code", "error")), str(err.get("message", "")),
                        list(err.get("details") or []))
    except (ValueError, KeyError, TypeError, AttributeError):
        text = resp.text.strip().replace("\n", " ")[:200]
        return ApiError(resp.status_code, "http_error", f"HTTP {resp.status_code}: {text or resp.reason_phrase}")


def state_names(state: str | list[str]) -> list[str]:
    """Job states as the API takes them: lowercase names (its schema enumerates them), so "RUNNING" is "running"."""
    return [s.strip().lower() for s in ([state] if isinstance(state, str) else state)]


def time_filters(**times: When) -> dict[str, str | float]:
    """`since`/`until` query parameters, leaving out the ones not given."""
    return {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in times.items()
            if v is not None and v != ""}

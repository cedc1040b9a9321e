"""Cursor pagination of lists (jobs, the audit log): opaque cursors over a keyset (time, id), newest first.

A page asks its source for `limit + 1` items; when the extra one exists,
`next_cursor` encodes the last item returned, and passing it back as
`cursor` gives the items after it. Keyset paging, not offsets, so items
created meanwhile never shift a page or repeat one. The cursor is opaque
to clients (url-safe base64 of JSON) and checked when it comes back.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from trainforge_services.common.errors import InvalidArgument

_BAD = "not a cursor this API returned; pass `next_cursor` of the previous page as it is"


def encode(ts: float, ident: str) -> str:
    raw = json.dumps([ts, ident], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str | None, field: str = "cursor") -> tuple[float, str] | None:
    if not cursor:
        return None
    try:
        ts, ident = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(ts, int | float) or not isinstance(ident, str) or not ident:
            raise ValueError
        return float(ts), ident
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidArgument(f"{field}: {_BAD}", details=[{"field": field, "message": _BAD}]) from None


def page(fetch: Callable[[int], list[dict]], limit: int, key: Callable[[dict], tuple[float, str]]) -> tuple[
        list[dict], str | None]:
    """(items, next_cursor) of one page: `fetch(n)` returns up to n items in the list's order."""
    items = fetch(limit + 1)
    if len(items) <= limit:
        return items, None
    items = items[:limit]
    return items, encode(*key(items[-1]))


def job_key(job: dict[str, Any]) -> tuple[float, str]:
    return float(job["created_at"]), str(job["id"])

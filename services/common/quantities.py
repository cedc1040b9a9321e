"""Sizes and durations as a manifest writes them (`4Gi`, `512M`, `10s`, `2m`), read into bytes and seconds.

`Memory` and `Duration` are the pydantic field types that do it; a bare
number is bytes or seconds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic.functional_validators import BeforeValidator

_BYTES = {
    "": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
}
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]i?)?[bB]?\s*$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_MAX_MEMORY = 16 * 2**40


def _scaled(value: Any, pattern: re.Pattern[str], units: Mapping[str, float], default_unit: str, *,
            not_a_number: str, unreadable: str) -> float:
    """A bare number as it is, or a number with a unit (`pattern`'s groups 1 and 2) times the unit's factor."""
    if isinstance(value, bool):
        raise ValueError(not_a_number)
    if isinstance(value, int | float):
        return value
    m = pattern.match(str(value))
    if not m:
        raise ValueError(f"{value!r} {unreadable}")
    return float(m.group(1)) * units[(m.group(2) or default_unit).lower()]


def parse_memory(value: Any) -> int:
    """'4Gi' -> 4294967296; a bare number is bytes."""
    n = int(_scaled(value, _SIZE, _BYTES, "", not_a_number="must be a size such as 512Mi or 4Gi",
                    unreadable="is not a size; use e.g. 512Mi, 4Gi or a number of bytes"))
    if n <= 0:
        raise ValueError("must be greater than 0")
    if n > _MAX_MEMORY:
        raise ValueError("must be at most 16Ti")
    return n


def parse_duration(value: Any) -> float:
    """'10s' -> 10.0, '2m' -> 120.0; a bare number is seconds."""
    seconds = float(_scaled(value, _DURATION, _SECONDS, "s", not_a_number="must be a duration such as 10s or 2m",
                            unreadable="is not a duration; use e.g. 500ms, 10s, 2m or 1h"))
    if seconds < 0:
        raise ValueError("must not be negative")
    return seconds


Memory = Annotated[int, BeforeValidator(parse_memory)]
Duration = Annotated[float, BeforeValidator(parse_duration)]

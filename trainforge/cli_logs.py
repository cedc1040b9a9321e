"""Printing log lines fast: the same look as `_print_line`, without rich's cost per line.

A 200,000-line log printed through rich takes minutes; lines here are
formatted by hand (ANSI colours only on a terminal) and written in chunks.
"""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console

_STYLE = {"stderr": "\x1b[31m", "system": "\x1b[2m"}
_DIM, _RESET = "\x1b[2m", "\x1b[0m"


def format_cursor(cursor: dict[str, int]) -> str:
    """The API's `next` cursor (`<learner>:<attempt>=<seq>,...`) for the lines seen."""
    def order(item: tuple[str, int]) -> tuple[int, int]:
        learner, _, attempt = item[0].partition(":")
        return int(learner), int(attempt)

    return ",".join(f"{k}={v}" for k, v in sorted(cursor.items(), key=order))


class LinePrinter:
    """Buffers formatted lines and writes them in chunks of about 64 KiB."""

    def __init__(self, console: Console, out: TextIO | None = None, chunk: int = 1 << 16):
        self._out = out or sys.stdout
        self._colour = console.is_terminal and not console.no_color
        self._buf: list[str] = []
        self._size, self._chunk = 0, chunk

    def print(self, line: dict) -> None:
        attempt = line.get("attempt", 1)
        tag = f"[{line['learner']}]" if attempt <= 1 else f"[{line['learner']}/{attempt}]"
        text = line["line"]
        if self._colour:
            style = _STYLE.get(line.get("stream", ""), "")
            text = f"{_DIM}{tag}{_RESET} {style}{text}{_RESET if style else ''}\n"
        else:
            text = f"{tag} {text}\n"
        self._buf.append(text)
        self._size += len(text)
        if self._size >= self._chunk:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            self._out.write("".join(self._buf))
            self._buf, self._size = [], 0
        self._out.flush()

    def close(self) -> None:
        self.flush()

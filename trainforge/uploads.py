"""What a submit sends besides the archive: the manifest with command-line overrides, and an upload that
reports its progress.

`with_overrides` merges `--param k=v` / `--env K=V` over the manifest's own
`params` / `env` (the result is sent as JSON, which the API parses like
YAML). `ProgressReader` wraps the temporary archive for httpx, which streams
a file object in chunks and takes its length from the file.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml


def with_overrides(text: str, params: dict[str, Any] | None, env: dict[str, str] | None) -> str:
    """The manifest text with --param/--env values merged in (JSON); unchanged when there are none, and a
    manifest that does not parse is sent as it is so the server names its problems."""
    if not params and not env:
        return text
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if not isinstance(data, dict):
        return text
    for field, extra in (("params", params), ("env", env)):
        if extra:
            current = data.get(field)
            data[field] = {**(current if isinstance(current, dict) else {}), **extra}
    return json.dumps(data)


class ProgressReader(io.RawIOBase):
    """A file read through for an upload, reporting each chunk; length and rewinding come from the file."""

    def __init__(self, f: Any, on_bytes: Callable[[int], None] | None):
        self._f, self._on_bytes = f, on_bytes

    def read(self, size: int = -1) -> bytes:
        chunk = self._f.read(size)
        if chunk and self._on_bytes is not None:
            self._on_bytes(len(chunk))
        return chunk

    def fileno(self) -> int:
        return self._f.fileno()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readable(self) -> bool:
        return True


def code_dir_of(manifest: str | dict, base: Path) -> Path | None:
    """The manifest's `code:` folder (its text, or the parsed mapping), resolved against the manifest's folder.

    A manifest that does not parse is sent as it is, so the server reports its problems.
    """
    try:
        data = yaml.safe_load(manifest) if isinstance(manifest, str) else manifest
    except yaml.YAMLError:
        return None
    code = data.get("code") if isinstance(data, dict) else None
    if not code or not isinstance(code, str):
        return None
    path = Path(code).expanduser()
    return path if path.is_absolute() else base / path

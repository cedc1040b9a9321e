"""Packing a code folder for upload: what goes in, how big it is, and a file to stream from.

What is left out: the folder's `.gitignore` and `.trainforgeignore` patterns
(gitignore syntax, through pathspec; nested `.gitignore` files apply below
their own folder, `.trainforgeignore` is read at the top only), plus VCS
data, caches and virtual environments that are never code (`.git/`,
`__pycache__/`, `*.pyc`, a folder holding `pyvenv.cfg`). The files are
listed and summed first, so a folder over the server's limit is refused
before anything is read or sent; the archive is then written to a temporary
file, not memory, and the upload streams from it.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pathspec

IGNORE_FILES = (".gitignore", ".trainforgeignore")
ALWAYS_IGNORED = pathspec.GitIgnoreSpec.from_lines([".git/", "__pycache__/", "*.pyc", "*.pyo"])
# The server's default limit for a code archive (TF_MAX_UPLOAD_BYTES); the folder's size is what is checked.
DEFAULT_MAX_BYTES = 256 * 2**20


class PackError(Exception):
    """The folder cannot be packed: missing, or larger than the limit."""


@dataclass(frozen=True)
class CodeFiles:
    """The files of a code folder that will be uploaded, relative to it, and their total size."""

    root: Path
    files: tuple[str, ...]
    total_bytes: int
    ignored: int


def _spec_of(folder: Path, names: tuple[str, ...]) -> pathspec.GitIgnoreSpec | None:
    lines: list[str] = []
    for name in names:
        try:
            lines += (folder / name).read_text(errors="replace").splitlines()
        except OSError:
            continue
    return pathspec.GitIgnoreSpec.from_lines(lines) if lines else None


def list_code(root: str | Path) -> CodeFiles:
    """Every file to upload, honouring the ignore files; PackError when root is not a folder."""
    root = Path(root)
    if not root.is_dir():
        raise PackError(f"code: {root} is not a folder")
    # (folder relative to root, its spec): a pattern applies to paths relative to the folder it was read in.
    top = _spec_of(root, IGNORE_FILES)
    files: list[str] = []
    total = ignored = 0

    def ignored_by(rel: str, specs: list[tuple[str, pathspec.GitIgnoreSpec]]) -> bool:
        if ALWAYS_IGNORED.match_file(rel):
            return True
        for base, spec in specs:
            sub = rel[len(base) + 1:] if base else rel
            if spec.match_file(sub):
                return True
        return False

    def walk(folder: Path, rel_folder: str, specs: list[tuple[str, pathspec.GitIgnoreSpec]]) -> None:
        nonlocal total, ignored
        if rel_folder:
            nested = _spec_of(folder, (".gitignore",))
            if nested is not None:
                specs = specs + [(rel_folder, nested)]
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise PackError(f"code: cannot read {folder}: {e.strerror or e}") from None
        for entry in entries:
            rel = f"{rel_folder}/{entry.name}" if rel_folder else entry.name
            if entry.is_dir(follow_symlinks=False):
                if ignored_by(rel + "/", specs) or (Path(entry.path) / "pyvenv.cfg").exists():
                    ignored += 1
                    continue
                walk(Path(entry.path), rel, specs)
            elif ignored_by(rel, specs):
                ignored += 1
            else:
                files.append(rel)
                total += entry.stat(follow_symlinks=False).st_size

    walk(root, "", [("", top)] if top is not None else [])
    return CodeFiles(root=root, files=tuple(files), total_bytes=total, ignored=ignored)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def check_size(code: CodeFiles, max_bytes: int) -> None:
    """PackError naming the size and the limit when the files alone are over it (they only shrink by gzip
    if they compress, and most large files - data, weights - do not)."""
    if code.total_bytes > max_bytes:
        raise PackError(f"code: {code.root} holds {human(code.total_bytes)} in {len(code.files)} files, over the "
                        f"upload limit of {human(max_bytes)}; list data folders and environments in "
                        f".trainforgeignore (or .gitignore) and load data with the manifest's `data:`")


def code_to_send(folder: Path, max_bytes: int) -> CodeFiles:
    """The files of a code folder an upload sends (ignore files honoured); PackError when the folder is
    missing or too large, before anything is packed."""
    if not folder.is_dir():
        raise PackError(f"code: folder {folder} does not exist")
    code = list_code(folder)
    check_size(code, max_bytes)
    return code


def pack_to_file(code: CodeFiles, out: IO[bytes],
                 on_file: Callable[[int], None] | None = None) -> int:
    """Write the gzip tar of `code` to `out`; on_file(bytes) after each file; returns the archive size."""
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for rel in code.files:
            path = code.root / rel
            tar.add(path, arcname=rel, recursive=False)
            if on_file is not None:
                try:
                    on_file(path.lstat().st_size)
                except OSError:
                    on_file(0)
    out.flush()
    return out.tell()


def temporary_archive(code: CodeFiles, on_file: Callable[[int], None] | None = None) -> IO[bytes]:
    """The archive in an anonymous temporary file, positioned at its start (closing it deletes it)."""
    tmp = tempfile.TemporaryFile(prefix="trainforge-code-")
    try:
        pack_to_file(code, tmp, on_file)
        tmp.seek(0)
    except BaseException:
        tmp.close()
        raise
    return tmp


def read_chunks(f: IO[bytes], on_bytes: Callable[[int], None] | None = None,
                size: int = 1 << 20) -> Iterator[bytes]:
    """The file in chunks, reporting each chunk's size: an upload that streams and can show progress."""
    while chunk := f.read(size):
        if on_bytes is not None:
            on_bytes(len(chunk))
        yield chunk

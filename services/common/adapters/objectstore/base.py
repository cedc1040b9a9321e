"""The object-store interface and what every store shares.

Objects are addressed by key ("jobs/<job>/code.tar.gz"; the layout is
`trainforge_services.common.contracts.storekeys`); users see them as `store://<key>`
URIs. Every upload is verified before it returns: the stored size and
SHA-256 must match the local file's, or `StoreError` is raised and the
caller must not move the job on. No external client is imported here.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from trainforge_services.common.errors import TrainforgeError


class TransferCounter:
    """Bytes this process moved to and from object stores, by direction ("put", "get").

    Process-wide: the services export it on /metrics as
    `trainforge_objectstore_bytes_total{direction}`. Counted when a transfer
    completed (a streamed read: per chunk handed out).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = {"put": 0, "get": 0}

    def add(self, direction: str, n: int) -> None:
        with self._lock:
            self._bytes[direction] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._bytes)


TRANSFERRED = TransferCounter()


class StoreError(TrainforgeError):
    code = "store_error"
    http_status = 502


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class ObjectStore(Protocol):
    def put_file(self, key: str, path: Path) -> ObjectInfo: ...
    def get_file(self, key: str, path: Path) -> ObjectInfo: ...
    def put_bytes(self, key: str, data: bytes) -> ObjectInfo: ...
    def get_bytes(self, key: str) -> bytes: ...
    def list(self, prefix: str) -> list[ObjectInfo]: ...  # keys and sizes; sha256 is ""
    def exists(self, key: str) -> bool: ...
    def delete_prefix(self, prefix: str) -> int: ...
    def info(self, key: str) -> ObjectInfo: ...  # size and the SHA-256 recorded at upload; NotFound if missing
    def iter_bytes(self, key: str, chunk: int = 1 << 20) -> Iterator[bytes]: ...  # NotFound before the first chunk
    def presign(self, key: str, expires: int) -> str | None: ...  # a GET URL valid `expires` s, or None


def put_dir(store: ObjectStore, prefix: str, directory: Path) -> list[ObjectInfo]:
    """Upload every file under directory to prefix/<relative path>, verified; symbolic links are skipped
    (a learner's outputs must not name the platform's own files)."""
    out = []
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file() and not p.is_symlink()):
        out.append(store.put_file(f"{prefix.rstrip('/')}/{path.relative_to(directory).as_posix()}", path))
    return out


def safe_relative(rel: str) -> bool:
    """Whether `rel` (a key below a prefix) stays below it once used as a relative path."""
    parts = PurePosixPath(rel).parts
    return bool(rel) and not rel.startswith("/") and "\\" not in rel and ".." not in parts


def objects_under(store: ObjectStore, prefix: str) -> list[tuple[ObjectInfo, str]]:
    """(info, path relative to prefix) of every object below `prefix`, skipping keys that climb out.

    A store may match a prefix loosely (S3 lists "data/mnist2/..." for
    "data/mnist"), so keys are checked to lie below `prefix/`.
    """
    prefix = prefix.rstrip("/") + "/"
    out = []
    for info in store.list(prefix):
        if not info.key.startswith(prefix):
            continue
        rel = info.key[len(prefix):]
        if safe_relative(rel):
            out.append((info, rel))
    return out


def get_dir(store: ObjectStore, prefix: str, directory: Path, *,
            last: Callable[[str], bool] = lambda _rel: False) -> list[ObjectInfo]:
    """Download every object under prefix into directory, keeping relative paths.

    Objects for which `last(rel)` holds are downloaded after the others (a
    completion marker, so an interrupted download never looks complete).
    """
    items = sorted(objects_under(store, prefix), key=lambda item: last(item[1]))
    return [store.get_file(info.key, Path(directory) / rel) for info, rel in items]


class PutBytesViaFile:
    """put_bytes as put_file of a temporary file, so bytes get the same verified path as files."""

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        raise NotImplementedError

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        with tempfile.NamedTemporaryFile(delete=False) as f:
            f.write(data)
        try:
            return self.put_file(key, Path(f.name))
        finally:
            os.unlink(f.name)

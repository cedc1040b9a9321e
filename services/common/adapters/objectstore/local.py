"""Objects as files under a local directory: the embedded default store."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from trainforge_services.common.contracts.storekeys import uri_for
from trainforge_services.common.errors import InvalidArgument, NotFound

from .base import TRANSFERRED, ObjectInfo, PutBytesViaFile, StoreError, sha256_file


class LocalStore(PutBytesViaFile):
    """Objects as files under a root directory (the embedded default)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        key = key.strip("/")
        if not key or ".." in key.split("/"):
            raise InvalidArgument(f"invalid object key {key!r}")
        return self.root / key

    def _info(self, key: str, path: Path) -> ObjectInfo:
        return ObjectInfo(key.strip("/"), path.stat().st_size, sha256_file(path))

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        want = ObjectInfo(key.strip("/"), Path(path).stat().st_size, sha256_file(Path(path)))
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".upload-")
        os.close(fd)
        try:
            shutil.copyfile(path, tmp)
            got = self._info(key, Path(tmp))
            if got != want:
                raise StoreError(f"upload of {key} did not verify: {got} != {want}")
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        TRANSFERRED.add("put", want.size)
        return want

    def get_file(self, key: str, path: Path) -> ObjectInfo:
        src = self._path(key)
        if not src.is_file():
            raise NotFound(f"object {uri_for(key)} does not exist")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, path)
        got = self._info(key, Path(path))
        TRANSFERRED.add("get", got.size)
        return got

    def get_bytes(self, key: str) -> bytes:
        src = self._path(key)
        if not src.is_file():
            raise NotFound(f"object {uri_for(key)} does not exist")
        data = src.read_bytes()
        TRANSFERRED.add("get", len(data))
        return data

    def info(self, key: str) -> ObjectInfo:
        src = self._path(key)
        if not src.is_file():
            raise NotFound(f"object {uri_for(key)} does not exist")
        return self._info(key, src)

    def iter_bytes(self, key: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        src = self._path(key)
        if not src.is_file():
            raise NotFound(f"object {uri_for(key)} does not exist")
        f = open(src, "rb")  # opened here, so a missing object fails before streaming starts

        def chunks() -> Iterator[bytes]:
            with f:
                while block := f.read(chunk):
                    TRANSFERRED.add("get", len(block))
                    yield block

        return chunks()

    def presign(self, key: str, expires: int) -> str | None:
        # Nobody outside this machine can read a local directory: the API streams instead.
        return None

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Like S3Store.list: keys and sizes, no SHA-256 (sha256 is ""), so a listing reads no file."""
        prefix = prefix.strip("/")
        base = self.root / prefix if prefix else self.root
        if base.is_file():
            return [ObjectInfo(prefix, base.stat().st_size, "")]
        if not base.is_dir():
            return []
        return [ObjectInfo(p.relative_to(self.root).as_posix(), p.stat().st_size, "")
                for p in sorted(base.rglob("*")) if p.is_file() and not p.name.startswith(".upload-")]

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete_prefix(self, prefix: str) -> int:
        items = self.list(prefix)
        for info in items:
            self._path(info.key).unlink(missing_ok=True)
        return len(items)

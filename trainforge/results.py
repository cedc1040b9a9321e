"""A job's results back to this machine: outputs and checkpoints, listed and downloaded, verified.

`Results` (reached as `Client.results`) lists what a job left in the object
store and downloads it file by file. Each file is streamed to a temporary
file next to its destination while its SHA-256 is computed, and moved into
place only when size and SHA-256 match the listing's, so a download that
was cut or corrupted never leaves a file that looks complete. The API may
answer a file with a redirect to a presigned URL (S3); it is followed, and
httpx drops the API key when the redirect leaves the API's origin.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from trainforge.sdk import Client

# on_bytes(n): n more bytes arrived (for a progress bar).
Progress = Callable[[int], None]


@dataclass(frozen=True)
class Fetched:
    path: Path
    size: int
    sha256: str


def _safe_dest(root: Path, rel: str) -> Path:
    """root/rel, refusing a path that would land outside root (a listing is remote input)."""
    parts = PurePosixPath(rel).parts
    if not rel or rel.startswith("/") or "\\" in rel or ".." in parts:
        from trainforge.sdk import ClientError

        raise ClientError(f"refusing to write {rel!r}: it leaves the download folder")
    return root.joinpath(*parts)


class Results:
    def __init__(self, client: Client):
        self._c = client

    # -- listings -------------------------------------------------------------------

    def outputs(self, job_id: str, learner: int | None = None) -> list[dict]:
        """[{rank, files: [{path, size, sha256}]}] per learner."""
        params = {"learner": learner} if learner is not None else {}
        return self._c._request("GET", f"/v1/jobs/{job_id}/outputs", params=params)["learners"]

    def checkpoints(self, job_id: str) -> list[dict]:
        """[{rank, steps}]: the complete stored checkpoint steps per learner, oldest first."""
        return self._c._request("GET", f"/v1/jobs/{job_id}/checkpoints")["learners"]

    def checkpoint_files(self, job_id: str, rank: int, step: int) -> list[dict]:
        return self._c._request("GET", f"/v1/jobs/{job_id}/checkpoints/{rank}/{step}")["files"]

    # -- downloads ------------------------------------------------------------------

    def download_outputs(self, job_id: str, dest: str | Path, learner: int | None = None, *,
                         on_bytes: Progress | None = None, listing: list[dict] | None = None) -> list[Fetched]:
        """Every output file (of one learner, or all) into dest/<rank>/<path>, each verified."""
        listing = listing if listing is not None else self.outputs(job_id, learner)
        out = []
        for entry in listing:
            for f in entry["files"]:
                target = _safe_dest(Path(dest), f"{entry['rank']}/{f['path']}")
                out.append(self.fetch(f"/v1/jobs/{job_id}/outputs/{entry['rank']}/{f['path']}", target,
                                      size=f["size"], sha256=f["sha256"], on_bytes=on_bytes))
        return out

    def download_checkpoint(self, job_id: str, rank: int, step: int, dest: str | Path, *,
                            on_bytes: Progress | None = None, files: list[dict] | None = None) -> list[Fetched]:
        """One checkpoint step of one learner into dest/<path>, each file verified."""
        files = files if files is not None else self.checkpoint_files(job_id, rank, step)
        return [self.fetch(f"/v1/jobs/{job_id}/checkpoints/{rank}/{step}/files/{f['path']}",
                           _safe_dest(Path(dest), f["path"]), size=f["size"], sha256=f["sha256"],
                           on_bytes=on_bytes) for f in files]

    def fetch(self, url_path: str, target: Path, *, size: int, sha256: str,
              on_bytes: Progress | None = None) -> Fetched:
        """GET url_path into target, verified against size and sha256 (when the listing had one)."""
        from trainforge.sdk import ApiError, _error_from

        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.download-")
        h, got = hashlib.sha256(), 0
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    with self._c._http.stream("GET", url_path, follow_redirects=True) as resp:
                        if not resp.is_success:
                            resp.read()
                            raise _error_from(resp)
                        for chunk in resp.iter_bytes(1 << 20):
                            out.write(chunk)
                            h.update(chunk)
                            got += len(chunk)
                            if on_bytes:
                                on_bytes(len(chunk))
                except httpx.HTTPError as e:
                    raise ApiError(0, "unavailable", f"download of {url_path} failed: {e}") from None
            if got != size or (sha256 and h.hexdigest() != sha256):
                raise ApiError(0, "checksum_mismatch",
                               f"download of {url_path} did not verify: got {got} bytes sha256 {h.hexdigest()}, "
                               f"expected {size} bytes sha256 {sha256 or '(not recorded)'}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return Fetched(target, got, h.hexdigest())


def total_bytes(files: list[dict[str, Any]]) -> int:
    return sum(int(f["size"]) for f in files)

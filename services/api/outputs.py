"""A job's results back: its outputs and checkpoints, listed with checksums, sent as files or a tar stream.

What a learner leaves in the object store is a *tree* under one key prefix
(`trainforge_services.common.contracts.storekeys`): its outputs `jobs/<job>/outputs/<rank>/`
and each checkpoint step `jobs/<job>/checkpoints/<rank>/<step>/`. Everything
here works on such trees. Callers check the job belongs to the caller's
team first (the routes ask the Trainer), so nothing here knows about teams.

Files are never read into memory: one file is streamed chunk by chunk from
the store, or - when the store can hand out a presigned URL (S3) - the
client is redirected to it. A whole tree is a tar stream whose headers are
written here (`tarfile.TarInfo.tobuf`), so a tree of any size goes out with
one chunk in memory at a time. Checksums are the SHA-256 the store recorded
when the file was uploaded, so a client can verify what it received.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

from trainforge_frameworks.torch.helper import CHECKPOINT_META
from trainforge_services.common.adapters.objectstore import (
    ObjectInfo,
    ObjectStore,
    objects_under,
    safe_relative,
)
from trainforge_services.common.contracts.storekeys import (
    checkpoint_root,
    checkpoint_step_prefix,
    is_step_dir,
    outputs_prefix,
    outputs_root,
)
from trainforge_services.common.errors import NotFound

_BLOCK = 512


@dataclass(frozen=True)
class TreeFile:
    path: str  # relative to the tree's prefix
    key: str
    size: int
    sha256: str

    def json(self) -> dict:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


def tree(store: ObjectStore, prefix: str, *, checksums: bool = True) -> list[TreeFile]:
    """Every file below prefix, sorted by path; with checksums, each one's recorded SHA-256."""
    out = []
    for info, rel in sorted(objects_under(store, prefix), key=lambda item: item[1]):
        sha = store.info(info.key).sha256 if checksums else ""
        out.append(TreeFile(rel, info.key, info.size, sha))
    return out


def output_ranks(store: ObjectStore, job_id: str) -> list[int]:
    """Ranks that uploaded outputs, in order."""
    root = outputs_root(job_id)
    ranks = {info.key[len(root):].split("/", 1)[0] for info in store.list(root) if info.key.startswith(root)}
    return sorted(int(r) for r in ranks if r.isdigit())


def outputs(store: ObjectStore, job_id: str, learner: int | None = None) -> list[dict]:
    """[{rank, files: [{path, size, sha256}]}] of the job's learners (or of one)."""
    ranks = [learner] if learner is not None else output_ranks(store, job_id)
    return [{"rank": r, "files": [f.json() for f in tree(store, outputs_prefix(job_id, r))]} for r in ranks]


def output_file(store: ObjectStore, job_id: str, rank: int, path: str) -> TreeFile:
    return _file_in(store, outputs_prefix(job_id, rank), path)


def output_files(store: ObjectStore, job_id: str, learner: int | None = None) -> list[tuple[str, TreeFile]]:
    """(archive name `<rank>/<path>`, file) of every output of the job (or of one learner)."""
    ranks = [learner] if learner is not None else output_ranks(store, job_id)
    return [(f"{r}/{f.path}", f) for r in ranks for f in tree(store, outputs_prefix(job_id, r), checksums=False)]


def checkpoint_steps(store: ObjectStore, job_id: str) -> list[dict]:
    """[{rank, steps}] where steps are the complete copies (their checkpoint.json is stored), oldest first."""
    root = checkpoint_root(job_id)
    steps: dict[int, set[int]] = {}
    for info in store.list(root):
        parts = info.key[len(root):].split("/") if info.key.startswith(root) else []
        if len(parts) == 3 and parts[0].isdigit() and is_step_dir(parts[1]) and parts[2] == CHECKPOINT_META:
            steps.setdefault(int(parts[0]), set()).add(int(parts[1]))
    return [{"rank": rank, "steps": sorted(s)} for rank, s in sorted(steps.items())]


def checkpoint_prefix(store: ObjectStore, job_id: str, rank: int, step: int) -> str:
    """The prefix of one complete checkpoint step; NotFound for a step that is missing or incomplete."""
    root = checkpoint_root(job_id)
    prefix = checkpoint_step_prefix(root, rank, step)
    if step < 0 or not store.exists(prefix + CHECKPOINT_META):
        have = next((c["steps"] for c in checkpoint_steps(store, job_id) if c["rank"] == rank), [])
        raise NotFound(f"learner {rank} of job {job_id} has no stored checkpoint at step {step}"
                       + (f" (stored: {', '.join(map(str, have))})" if have else ""),
                       details=[{"field": "step", "message": "no such checkpoint step"}])
    return prefix


def checkpoint_file(store: ObjectStore, job_id: str, rank: int, step: int, path: str) -> TreeFile:
    return _file_in(store, checkpoint_prefix(store, job_id, rank, step), path)


def _file_in(store: ObjectStore, prefix: str, path: str) -> TreeFile:
    if not safe_relative(path):
        raise NotFound(f"no file {path!r} here", details=[{"field": "path", "message": "no such file"}])
    key = prefix + path
    try:
        info: ObjectInfo = store.info(key)
    except NotFound:
        raise NotFound(f"no file {path!r} here", details=[{"field": "path", "message": "no such file"}]) from None
    return TreeFile(path, key, info.size, info.sha256)


def tar_stream(store: ObjectStore, files: list[tuple[str, TreeFile]]) -> Iterator[bytes]:
    """A POSIX (pax) tar of `files` as (name, file), one store chunk at a time."""
    for name, f in files:
        info = tarfile.TarInfo(name)
        info.size, info.mode = f.size, 0o644
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        sent = 0
        for chunk in store.iter_bytes(f.key):
            sent += len(chunk)
            yield chunk
        if sent != f.size:
            # The header promised f.size bytes; a short or long body would shift every later member.
            raise RuntimeError(f"object {f.key} changed size while it was sent ({sent} != {f.size} bytes)")
        if f.size % _BLOCK:
            yield b"\0" * (_BLOCK - f.size % _BLOCK)
    yield b"\0" * (2 * _BLOCK)

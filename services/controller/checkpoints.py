"""A learner's checkpoints in the object store: copied up while it runs and on halt, restored before it starts.

Layout (docs/CONTRACTS.md, "Checkpoints in the object store"):
`jobs/<job>/checkpoints/<rank>/<step, 12 digits>/` holds a copy of the
learner's checkpoint directory. The learner-side helper writes
`checkpoint.json` ({"step": n, ...}) after the checkpoint itself, and it is
uploaded last here, so a step whose `checkpoint.json` is in the store is a
complete, verified copy (every upload checks size and SHA-256).

The learner may write its next checkpoint while the previous one is being
uploaded. The files named at one moment are hard-linked (copied where links
are impossible) into a snapshot first, and the snapshot only counts when the
directory still holds the very `checkpoint.json` file it started from (the
helper removes it before replacing anything, see `CheckpointSync._snapshot`);
otherwise it is thrown away and taken again at the next look, so an upload
never mixes two checkpoints.

A restore picks the newest step present for *every* rank of the job, so DDP
learners always restart from the same step.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from trainforge_frameworks.torch.helper import CHECKPOINT_META as META
from trainforge_frameworks.torch.helper import step_in
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.adapters.objectstore import ObjectStore, get_dir
from trainforge_services.common.contracts.etcd import CheckpointStored
from trainforge_services.common.contracts.storekeys import (
    checkpoint_rank_prefix,
    checkpoint_root,
    checkpoint_step_prefix,
    is_step_dir,
    split_checkpoint_uri,
    uri_for_prefix,
)
from trainforge_services.common.errors import NotFound, TrainforgeError, message_of
from trainforge_services.common.loop import Loop

log = logging.getLogger(__name__)

KEEP = 3


def stored_steps(store: ObjectStore, root: str, rank: int) -> list[int]:
    """Steps of one rank whose copy is complete (its checkpoint.json is stored), oldest first."""
    prefix = checkpoint_rank_prefix(root, rank)
    steps = set()
    for info in store.list(prefix):
        if not info.key.startswith(prefix):
            continue
        parts = info.key[len(prefix):].split("/")
        if len(parts) == 2 and parts[1] == META and is_step_dir(parts[0]):
            steps.add(int(parts[0]))
    return sorted(steps)


def common_step(store: ObjectStore, root: str, world_size: int) -> int | None:
    """The newest step every rank 0..world_size-1 stored completely; None when there is none."""
    common: set[int] | None = None
    for rank in range(world_size):
        steps = set(stored_steps(store, root, rank))
        common = steps if common is None else common & steps
        if not common:
            return None
    return max(common) if common else None


def choose_step(store: ObjectStore, uri: str, rank: int, world_size: int, *, own: bool = False) -> int | None:
    """The step a learner restores from `uri`; None when no step is complete for every rank.

    A job's checkpoint root gives the newest step every rank stored
    completely. A URI naming one step's copy (`.../<rank>/<step>/`, accepted
    for compatibility) gives that step, in this learner's own rank's copy,
    which must be complete (NotFound otherwise). With `own` (an elastic
    job, whose learners come and go) a job's root gives the newest step this
    rank stored: the group agrees on the newest any rank holds once it runs
    (frameworks/torch/elastic.py).
    """
    root, step = split_checkpoint_uri(uri)
    if step is None and own:
        return max(stored_steps(store, root, rank), default=None)
    if step is None:
        return common_step(store, root, world_size)
    if step not in stored_steps(store, root, rank):
        raise NotFound(f"checkpoint {uri}: rank {rank} has no complete copy of step {step}")
    return step


def copy_uri(uri: str, rank: int, step: int) -> str:
    """The URI of the copy `choose_step` picked: this rank's copy of `step` under the URI's root."""
    return uri_for_prefix(checkpoint_step_prefix(split_checkpoint_uri(uri)[0], rank, step))


def restore(store: ObjectStore, uri: str, rank: int, world_size: int, directory: Path, *,
            own: bool = False) -> int | None:
    """Download into directory this rank's copy of the step `choose_step` picks; the step, or None."""
    step = choose_step(store, uri, rank, world_size, own=own)
    if step is None:
        return None
    prefix = checkpoint_step_prefix(split_checkpoint_uri(uri)[0], rank, step)
    directory.mkdir(parents=True, exist_ok=True)
    # checkpoint.json last, as it was uploaded: a crash mid-restore leaves no complete-looking directory
    get_dir(store, prefix, directory, last=lambda rel: rel == META)
    return step


class CheckpointSync:
    """Copies a learner's newer checkpoints to the object store (a thread while it runs, `sync()` at the end)."""

    def __init__(self, store_of: Callable[[], ObjectStore], coordinator: Coordinator, *, job_id: str, rank: int,
                 attempt: int, directory: Path, scratch: Path, interval: float = 1.0, keep: int = KEEP,
                 world_size: int = 1):
        self._store_of = store_of
        self._coord = coordinator
        self.job_id, self.rank, self.attempt, self.world_size = job_id, rank, attempt, world_size
        self.directory, self._scratch = directory, scratch
        self._keep = keep
        self._root = checkpoint_root(job_id)
        self._lock = threading.Lock()  # one upload at a time: the loop's and the final one
        self._loop = Loop("checkpoint-sync", self._look, interval=interval)
        self.uploaded_step: int | None = None
        self.uploaded_uri = ""

    def mark_restored(self, step: int, uri: str) -> None:
        """A checkpoint restored from the store (its copy at `uri`) need not be uploaded again."""
        self.uploaded_step, self.uploaded_uri = step, uri

    def start(self) -> CheckpointSync:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop(60)

    def _look(self) -> None:
        try:
            self.sync()
        except Exception as e:  # noqa: BLE001 - a failed upload is retried at the next look
            log.warning("checkpoint upload failed (retried): %s", message_of(e))

    def sync(self) -> int | None:
        """Upload the local checkpoint if it is newer than the last upload; the step now stored (or None)."""
        with self._lock:
            step = step_in(self.directory)
            if step is None or (self.uploaded_step is not None and step <= self.uploaded_step):
                return self.uploaded_step
            taken = self._snapshot()
            if taken is None:
                return self.uploaded_step  # the learner is mid-save; the next look gets it
            snapshot, step = taken
            try:
                if self.uploaded_step is not None and step <= self.uploaded_step:
                    return self.uploaded_step
                prefix = checkpoint_step_prefix(self._root, self.rank, step)
                files = sorted((p for p in snapshot.rglob("*") if p.is_file()), key=lambda p: p.name == META)
                store = self._store_of()
                for path in files:
                    store.put_file(prefix + path.relative_to(snapshot).as_posix(), path)
            finally:
                shutil.rmtree(snapshot, ignore_errors=True)
            self.uploaded_step, self.uploaded_uri = step, uri_for_prefix(prefix)
            log.info("checkpoint at step %d stored at %s (%d files)", step, self.uploaded_uri, len(files))
            self._announce(step)
            self._prune(store)
            return step

    def _snapshot(self) -> tuple[Path, int] | None:
        """A private copy of the checkpoint directory and its step, or None when a save is under way.

        The writer's side of the contract (frameworks/torch/helper.py):
        `checkpoint.json` is removed before any other file is replaced, and
        written again last. So `checkpoint.json` is opened first - an open
        file keeps its inode, whose number cannot go to a new file meanwhile
        - then the other files are linked (copied where links are
        impossible), and the copy counts only when the directory still holds
        that same `checkpoint.json` afterwards. Then no file was replaced
        while copying, and the files found are the ones that checkpoint.json
        was written after.
        """
        meta = self.directory / META
        # A sandboxed learner owns this directory and may plant links to the platform's files: the
        # directory must resolve inside the working directory and no link is followed.
        if not self.directory.resolve().is_relative_to(self.directory.parent.parent.resolve()):
            log.warning("%s resolves outside the working directory; not storing it", self.directory)
            return None
        try:
            meta_file = os.fdopen(os.open(meta, os.O_RDONLY | os.O_NOFOLLOW), "rb")
        except (FileNotFoundError, OSError):
            return None
        with meta_file:
            self._scratch.mkdir(parents=True, exist_ok=True)
            snapshot = Path(tempfile.mkdtemp(prefix=f".ckpt-{self.rank}-", dir=self._scratch))
            try:
                pinned = os.fstat(meta_file.fileno())
                (snapshot / META).write_bytes(meta_file.read())
                self._link_files(snapshot)
                try:
                    now = os.stat(meta)
                    unchanged = (now.st_dev, now.st_ino) == (pinned.st_dev, pinned.st_ino)
                except FileNotFoundError:
                    unchanged = False
                step = step_in(snapshot)
                if unchanged and step is not None:
                    return snapshot, step
            except BaseException:
                shutil.rmtree(snapshot, ignore_errors=True)
                raise
        shutil.rmtree(snapshot, ignore_errors=True)
        return None

    def _link_files(self, snapshot: Path) -> None:
        for path in self.directory.rglob("*"):
            if path.name.startswith(".") or path == self.directory / META or path.is_symlink() \
                    or not path.is_file():
                continue  # the helper's temporary files start with '.'; links are never followed
            target = snapshot / path.relative_to(self.directory)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except FileNotFoundError:
                continue
            except OSError:
                shutil.copy2(path, target)

    def _announce(self, step: int) -> None:
        value = CheckpointStored(attempt=self.attempt, step=step, uri=self.uploaded_uri)
        try:
            self._coord.put(self._coord.keys.learner_checkpoint(self.job_id, self.rank), value.value())
        except TrainforgeError as e:  # the store holds it; etcd only tells observers
            log.warning("could not record checkpoint step %d in etcd: %s", step, e.message)

    def _prune(self, store: ObjectStore) -> None:
        """Delete all but the newest `keep` steps of this rank - never the newest step every rank stored.

        Otherwise a rank whose uploads lag behind (a slow store) could find
        that its peers already deleted every step it has: a restore would
        start over. Best effort: the new step is stored whatever happens
        here, and the next upload prunes again.
        """
        try:
            older = stored_steps(store, self._root, self.rank)[:-self._keep]
            if older and self.world_size > 1:
                restore_point = common_step(store, self._root, self.world_size)
                older = [step for step in older if step != restore_point]
            for step in older:
                prefix = checkpoint_step_prefix(self._root, self.rank, step)
                try:
                    store.delete_prefix(prefix + META)  # first: the copy stops counting as complete
                    store.delete_prefix(prefix)
                except TrainforgeError as e:
                    log.warning("could not delete the old checkpoint at step %d: %s", step, e.message)
        except TrainforgeError as e:
            log.warning("could not look up the old checkpoints to delete: %s", e.message)

"""Checkpoint copies in the object store: upload while the learner saves, prune, and pick the step to restore."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from trainforge_frameworks.torch.helper import CHECKPOINT_META as META
from trainforge_services.common.adapters.objectstore import LocalStore, StoreError
from trainforge_services.common.errors import NotFound
from trainforge_services.common.keys import Keys
from trainforge_services.controller.checkpoints import (
    CheckpointSync,
    choose_step,
    common_step,
    copy_uri,
    restore,
    stored_steps,
)

# torch warns at import time when numpy is not installed; numpy is not needed here.
pytestmark = pytest.mark.filterwarnings("ignore:Failed to initialize NumPy:UserWarning")


class FakeCoordinator:
    def __init__(self):
        self.keys = Keys()
        self.data: dict[str, dict] = {}

    def put(self, key: str, value: dict, lease=None) -> None:  # noqa: ANN001 - Coordinator.put's shape
        self.data[key] = value


class RecordingStore(LocalStore):
    def __init__(self, root: Path):
        super().__init__(root)
        self.puts: list[str] = []

    def put_file(self, key: str, path: Path):  # noqa: ANN201 - LocalStore.put_file
        self.puts.append(key)
        return super().put_file(key, path)


@pytest.fixture
def store(tmp_path) -> RecordingStore:
    return RecordingStore(tmp_path / "store")


def syncer(store, tmp_path, coordinator=None, **kw) -> CheckpointSync:
    directory = tmp_path / "learner-0" / "ckpt"
    directory.mkdir(parents=True, exist_ok=True)
    return CheckpointSync(lambda: store, coordinator or FakeCoordinator(), job_id="j1", rank=0, attempt=2,
                          directory=directory, scratch=tmp_path, **kw)


def save(directory: Path, step: int, payload: str | None = None) -> None:
    """A checkpoint written the way the helper writes one: checkpoint.json gone, data replaced, json last."""
    (directory / META).unlink(missing_ok=True)
    (directory / "model.bin").write_text(payload or f"weights at {step}")
    (directory / "sub").mkdir(exist_ok=True)
    (directory / "sub" / "extra.txt").write_text(f"extra {step}")
    (directory / META).write_text(json.dumps({"step": step, "saved_at": 1.0}))


def stored(store, job: str, rank: int, step: int, complete: bool = True) -> None:
    prefix = f"jobs/{job}/checkpoints/{rank}/{step:012d}/"
    store.put_bytes(prefix + "model.bin", f"r{rank}s{step}".encode())
    if complete:
        store.put_bytes(prefix + META, json.dumps({"step": step}).encode())


def test_a_newer_checkpoint_is_uploaded_with_its_json_last_and_announced(store, tmp_path):
    coordinator = FakeCoordinator()
    sync = syncer(store, tmp_path, coordinator)
    assert sync.sync() is None  # nothing saved yet
    save(sync.directory, 7)
    (sync.directory / ".model.bin-123.tmp").write_text("half a file")  # the helper's next save, unfinished
    assert sync.sync() == 7
    prefix = "jobs/j1/checkpoints/0/000000000007/"
    assert sorted(store.puts) == sorted([prefix + "model.bin", prefix + "sub/extra.txt", prefix + META])
    assert store.puts[-1] == prefix + META
    assert store.get_bytes(prefix + "model.bin") == b"weights at 7"
    assert (sync.uploaded_step, sync.uploaded_uri) == (7, "store://" + prefix)
    assert coordinator.data[Keys().learner_checkpoint("j1", 0)] == {"attempt": 2, "step": 7,
                                                                     "uri": "store://" + prefix}
    store.puts.clear()
    assert sync.sync() == 7 and store.puts == [], "the same step is not uploaded twice"
    assert not list(tmp_path.glob(".ckpt-*")), "snapshots are removed"


def test_only_the_newest_three_steps_are_kept(store, tmp_path):
    sync = syncer(store, tmp_path)
    for step in (10, 20, 30, 40, 50):
        save(sync.directory, step)
        sync.sync()
    assert stored_steps(store, "jobs/j1/checkpoints", 0) == [30, 40, 50]
    assert not store.list("jobs/j1/checkpoints/0/000000000010/")


def test_the_newest_step_every_rank_stored_is_never_pruned(store, tmp_path):
    sync = syncer(store, tmp_path, world_size=2)
    stored(store, "j1", 1, 10)  # rank 1's uploads lag behind
    for step in (10, 20, 30, 40):
        save(sync.directory, step)
        sync.sync()
    assert stored_steps(store, "jobs/j1/checkpoints", 0) == [10, 20, 30, 40], "10 is the only common step"
    stored(store, "j1", 1, 30)
    save(sync.directory, 50)
    sync.sync()
    assert stored_steps(store, "jobs/j1/checkpoints", 0) == [30, 40, 50]


class UnlistableStore(RecordingStore):
    """Uploads work; listing (what pruning needs) fails."""

    def list(self, prefix: str):  # noqa: ANN201 - LocalStore.list
        raise StoreError(f"object store could not list {prefix}: connection reset")


def test_a_failed_prune_does_not_undo_a_stored_step(tmp_path, caplog):
    store, coordinator = UnlistableStore(tmp_path / "store"), FakeCoordinator()
    sync = syncer(store, tmp_path, coordinator, keep=1)
    save(sync.directory, 7)
    assert sync.sync() == 7, "pruning is best effort: the upload succeeded"
    prefix = "jobs/j1/checkpoints/0/000000000007/"
    assert (sync.uploaded_step, sync.uploaded_uri) == (7, "store://" + prefix)
    assert store.puts[-1] == prefix + META
    assert coordinator.data[Keys().learner_checkpoint("j1", 0)]["step"] == 7
    assert "could not look up the old checkpoints to delete" in caplog.text


def test_a_restored_step_is_not_uploaded_again(store, tmp_path):
    sync = syncer(store, tmp_path)
    save(sync.directory, 20)
    sync.mark_restored(20, "store://jobs/j1/checkpoints/0/000000000020/")
    assert sync.sync() == 20 and store.puts == []
    save(sync.directory, 21)
    assert sync.sync() == 21


def test_a_save_under_way_is_not_copied(store, tmp_path):
    sync = syncer(store, tmp_path)
    save(sync.directory, 5)
    (sync.directory / META).unlink()  # the helper removed it and is replacing the data
    assert sync.sync() is None and store.puts == []


def test_a_copy_whose_json_was_replaced_meanwhile_is_thrown_away(store, tmp_path, monkeypatch):
    sync = syncer(store, tmp_path)
    save(sync.directory, 5)
    real_link = __import__("os").link

    def link_then_save(src, dst):  # the learner saves step 6 while the snapshot is being taken
        real_link(src, dst)
        if not (sync.directory / META).read_text().startswith('{"step": 6'):
            save(sync.directory, 6, payload="weights at 6")

    monkeypatch.setattr("trainforge_services.controller.checkpoints.os.link", link_then_save)
    assert sync.sync() is None and store.puts == []
    monkeypatch.undo()
    assert sync.sync() == 6
    assert store.get_bytes("jobs/j1/checkpoints/0/000000000006/model.bin") == b"weights at 6"


def test_copies_never_mix_two_checkpoints_while_the_helper_saves(store, tmp_path, monkeypatch):
    import torch

    from trainforge_frameworks.torch import helper

    sync = syncer(store, tmp_path, keep=10**6)
    monkeypatch.setenv("TF_CHECKPOINT_DIR", str(sync.directory))
    done = threading.Event()

    def train():
        try:
            for step in range(1, 301):
                helper.save_checkpoint({"w": torch.full((20_000,), float(step))}, step)
        finally:
            done.set()

    writer = threading.Thread(target=train)
    writer.start()
    while not done.is_set():
        sync.sync()
    writer.join()
    assert sync.sync() == 300
    steps = stored_steps(store, "jobs/j1/checkpoints", 0)
    assert len(steps) > 3, "the uploads overlapped the saves"
    for step in steps:
        payload = torch.load(store.root / f"jobs/j1/checkpoints/0/{step:012d}/checkpoint.pt", weights_only=True)
        assert payload["step"] == step and torch.equal(payload["state"]["w"], torch.full((20_000,), float(step)))


def test_the_restore_step_is_the_newest_every_rank_stored_completely(store):
    for rank in (0, 1):
        for step in (10, 20):
            stored(store, "j1", rank, step)
    stored(store, "j1", 0, 30)
    stored(store, "j1", 1, 30, complete=False)
    stored(store, "j10", 0, 99)  # another job whose prefix starts the same
    assert common_step(store, "jobs/j1/checkpoints", 2) == 20
    assert choose_step(store, "store://jobs/j1/checkpoints/", 1, 2) == 20
    assert common_step(store, "jobs/j1/checkpoints", 3) is None  # rank 2 never stored anything
    assert common_step(store, "jobs/none/checkpoints", 1) is None


def test_a_uri_naming_one_step_restores_this_ranks_copy_of_it(store, tmp_path):
    for rank in (0, 1):
        stored(store, "j1", rank, 10)
    stored(store, "j1", 0, 20)
    uri = "store://jobs/j1/checkpoints/0/000000000010/"
    assert restore(store, uri, 1, 2, tmp_path / "r1") == 10
    assert (tmp_path / "r1" / "model.bin").read_bytes() == b"r1s10"
    assert copy_uri(uri, 1, 10) == "store://jobs/j1/checkpoints/1/000000000010/"
    assert copy_uri("store://jobs/j1/checkpoints/", 1, 10) == "store://jobs/j1/checkpoints/1/000000000010/"
    with pytest.raises(NotFound, match="rank 1 has no complete copy of step 20"):
        choose_step(store, "store://jobs/j1/checkpoints/0/000000000020/", 1, 2)

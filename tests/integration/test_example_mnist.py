"""The mnist example: alone as a script, and as a two-learner DDP job under two real controllers."""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.integration.test_controller_run import controller_log, launch, status  # noqa: F401 - fixture
from tests.servers import free_port, wait_for
from trainforge_services.common.adapters.objectstore import store_from_settings
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.common.states import LearnerState

EXAMPLE = Path(__file__).parents[2] / "examples" / "mnist"
SKIP = {"results", "checkpoints", "outputs", "__pycache__"}

pytestmark = pytest.mark.slow


def pack_example() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(EXAMPLE.iterdir()):
            if path.name not in SKIP:
                tar.add(path, arcname=path.name, filter=lambda i: None if "__pycache__" in i.name else i)
    return buf.getvalue()


def test_runs_alone_as_a_script(tmp_path):
    work = tmp_path / "mnist"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns(*SKIP))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "train.py", "--epochs", "1"], cwd=work, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    print(f"\nstandalone, 1 epoch: {time.monotonic() - started:.1f}s")
    metrics = json.loads((work / "results" / "metrics.json").read_text())
    assert metrics["world_size"] == 1 and metrics["test_accuracy"] > 0.8
    assert (work / "results" / "model.pt").is_file() and (work / "checkpoints" / "checkpoint.pt").is_file()
    assert "final test accuracy" in done.stdout


def test_two_learners_with_ddp_under_two_controllers(launch, coordinator, logstore, store_settings):  # noqa: F811
    manifest = parse_manifest((EXAMPLE / "manifest.yaml").read_text()).model_dump(mode="json")
    manifest["params"]["epochs"] = 1
    assert manifest["learners"] == 2 and yaml.safe_load((EXAMPLE / "manifest.yaml").read_text())["outputs"] == "results/"
    code, port = pack_example(), free_port()
    started = time.monotonic()
    first = launch(manifest, rank=0, world_size=2, code=code, master_port=port)
    second = launch(manifest, rank=1, world_size=2, code_uri=f"store://jobs/{first.job}/code.tar.gz",
                    master_port=port)
    runs = [first, second]
    rcs = [run.wait(180) for run in runs]
    elapsed = time.monotonic() - started
    assert rcs == [0, 0], [controller_log(r) for r in runs]
    docs = [status(coordinator, run) for run in runs]
    assert [d["state"] for d in docs] == [LearnerState.LEARNER_COMPLETED] * 2, docs
    print(f"\n2 learners x 1 epoch under 2 controllers: {elapsed:.1f}s; rank 0 tail: {docs[0]['tail']}")

    job = runs[0].job
    store = store_from_settings(store_settings)
    assert store.exists(f"jobs/{job}/outputs/0/model.pt")
    metrics = json.loads(store.get_bytes(f"jobs/{job}/outputs/0/metrics.json"))
    assert metrics["world_size"] == 2 and metrics["test_accuracy"] > 0.8
    assert not store.list(f"jobs/{job}/outputs/1/"), "only rank 0 writes results"
    assert elapsed < 120

    logstore.refresh()
    lines = logstore.read(job, limit=1000).lines
    finals = {ln["learner"] for ln in lines if ln["line"].startswith("final test accuracy")}
    assert finals == {0, 1}


ARGS = ["--epochs", "2", "--seed", "0", "--train-samples", "1200", "--test-samples", "200"]
PER_EPOCH = math.ceil(math.ceil(1200 / 2) / 32)  # batches per learner and epoch with ARGS and 2 learners


def ddp(work: Path, state: Path, port: int, interval: str = "0") -> list[subprocess.Popen]:
    """The example as two DDP processes on loopback, as the controllers would start them."""
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
        env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TF_CHECKPOINT_DIR=str(state / f"ckpt-{rank}"), TF_OUTPUT_DIR=str(state / f"out-{rank}"),
                   TF_CHECKPOINT_INTERVAL=interval, PYTHONUNBUFFERED="1")
        procs.append(subprocess.Popen([sys.executable, "train.py", *ARGS], cwd=work, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 120) -> list[str]:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return outs


def model(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=True)


def assert_bitwise_equal(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted two-learner run: the model every interrupted run must end with."""
    work = tmp_path_factory.mktemp("ref") / "mnist"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns(*SKIP))
    state = work.parent / "state"
    finish(ddp(work, state, free_port()))
    return model(state / "out-0" / "model.pt")


def saved_step(folder: Path) -> int:
    """The step of the complete checkpoint in a learner's checkpoint folder; -1: none, or a save under way."""
    try:
        return json.loads((folder / "checkpoint.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return -1


def signal_all(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        p.send_signal(sig)


def test_a_halted_and_resumed_ddp_run_ends_with_the_uninterrupted_model(tmp_path, reference):
    work = tmp_path / "mnist"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns(*SKIP))
    state = tmp_path / "state"
    # A checkpoint at every batch shows how far training is; the halt must come mid-epoch on any machine:
    # both learners are frozen a third into epoch 2, given the halt signal, and let go.
    procs = ddp(work, state, free_port(), interval="0.001")
    target = PER_EPOCH + PER_EPOCH // 3
    wait_for(lambda: saved_step(state / "ckpt-0") >= target, 90, f"rank 0 to reach step {target}", interval=0.01)
    signal_all(procs, signal.SIGSTOP)
    signal_all(procs, signal.SIGTERM)  # what the controllers send on a halt
    signal_all(procs, signal.SIGCONT)
    outs = finish(procs)
    halted = [re.search(r"halt requested; checkpoint saved at step (\d+)", out) for out in outs]
    assert all(halted), outs
    steps = {int(m.group(1)) for m in halted}
    assert len(steps) == 1, "every rank stops at the same batch"
    step = steps.pop()
    assert PER_EPOCH < step < 2 * PER_EPOCH, f"step {step} is not inside epoch 2 ({PER_EPOCH} batches per epoch)"
    assert "epoch 1/2" in outs[0] and "epoch 2/2" not in outs[0]
    assert not (state / "out-0" / "model.pt").exists()

    outs = finish(ddp(work, state, free_port()))
    resumed = [re.search(r"resuming from step (\d+) \(epoch 2, batch (\d+)\)", out) for out in outs]
    assert all(resumed), outs
    assert {(int(m.group(1)), int(m.group(2))) for m in resumed} == {(step, step - PER_EPOCH)}
    assert "epoch 1/2" not in outs[0] and "epoch 2/2" in outs[0]
    assert_bitwise_equal(model(state / "out-0" / "model.pt"), reference)


def frozen_at_one_step(procs: list[subprocess.Popen], state: Path) -> int | None:
    """Freeze both learners; the step when both hold a complete checkpoint of the same step, else go on (None)."""
    signal_all(procs, signal.SIGSTOP)
    steps = {saved_step(state / f"ckpt-{rank}") for rank in range(len(procs))}
    if len(steps) == 1 and (step := steps.pop()) >= 0:
        return step
    signal_all(procs, signal.SIGCONT)
    return None


def test_learners_killed_mid_epoch_resume_from_their_last_periodic_checkpoint(tmp_path, reference):
    work = tmp_path / "mnist"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns(*SKIP))
    state = tmp_path / "state"
    procs = ddp(work, state, free_port(), interval="0.001")
    wait_for(lambda: saved_step(state / "ckpt-0") >= PER_EPOCH // 3, 90, "periodic checkpoints in epoch 1",
             interval=0.01)
    # Killed without warning: no halt checkpoint, only the periodic ones. Rank 1 dies; rank 0 would fail at
    # its next all-reduce and the platform stops it anyway, so it is killed too - both while frozen at a
    # moment both hold the same step (on the platform the controllers' copies give that guarantee).
    step = wait_for(lambda: frozen_at_one_step(procs, state), 30, "both learners at one checkpoint")
    for p in reversed(procs):
        p.kill()
        p.communicate(timeout=10)
    assert 0 < step % PER_EPOCH, f"step {step} is an epoch boundary"

    outs = finish(ddp(work, state, free_port()))
    assert all(f"resuming from step {step} (epoch {step // PER_EPOCH + 1}, batch {step % PER_EPOCH})" in out
               for out in outs), outs
    assert_bitwise_equal(model(state / "out-0" / "model.pt"), reference)


def learner_of(run) -> psutil.Process:
    """The training process a controller runs (under the guard and sh)."""
    for child in psutil.Process(run.proc.pid).children(recursive=True):
        if child.cmdline()[1:2] == ["train.py"]:
            return child
    raise LookupError("no learner yet")


def test_a_learner_killed_mid_epoch_restarts_from_the_last_checkpoint_of_every_rank(
        launch, coordinator, logstore, store_settings, reference, tmp_path):  # noqa: F811
    manifest = parse_manifest((EXAMPLE / "manifest.yaml").read_text()).model_dump(mode="json")
    manifest["command"] = "python train.py " + " ".join(ARGS)
    manifest["checkpoint"] = {"interval": 0.001}  # a checkpoint at every batch
    code, port = pack_example(), free_port()
    first = launch(manifest, rank=0, world_size=2, code=code, master_port=port)
    job, code_uri = first.job, f"store://jobs/{first.job}/code.tar.gz"
    second = launch(manifest, rank=1, world_size=2, code_uri=code_uri, master_port=port)
    runs = [first, second]

    def stored_step(rank: int) -> int:
        doc = coordinator.get(coordinator.keys.learner_checkpoint(job, rank))[0]
        return doc["step"] if doc else -1

    # Training outruns the controllers' uploads (one look a second), so both learners are frozen in the
    # middle of epoch 1 until their controllers have stored what they hold - one rank may be a save ahead.
    local = first.spec_path.parent / "learner-0" / ".trainforge" / "checkpoints"
    target = PER_EPOCH // 2
    wait_for(lambda: saved_step(local) >= target, 120, f"rank 0 at step {target}", interval=0.01)
    learners = [learner_of(run) for run in runs]
    for p in learners:
        p.suspend()
    wait_for(lambda: min(stored_step(0), stored_step(1)) >= target - 1, 30, "both frozen checkpoints stored")
    learners[1].kill()
    learners[0].resume()  # it fails at its next all-reduce with rank 1
    assert second.wait(60) == 0
    assert status(coordinator, second)["state"] == LearnerState.LEARNER_FAILED
    first.proc.send_signal(signal.SIGTERM)  # the LCM removes the rest of the failed attempt
    first.wait(60)

    root = f"store://jobs/{job}/checkpoints/"
    port = free_port()
    again = [launch(manifest, rank=r, world_size=2, code_uri=code_uri, master_port=port, job=job, attempt=2,
                    checkpoint_uri=root) for r in range(2)]
    assert [r.wait(180) for r in again] == [0, 0], [controller_log(r) for r in again]
    assert [status(coordinator, r)["state"] for r in again] == [LearnerState.LEARNER_COMPLETED] * 2

    logstore.refresh()
    lines = [ln["line"] for ln in logstore.read(job, limit=5000).lines if ln["attempt"] == 2]
    resumed = {re.search(r"resuming from step (\d+) \(epoch 1, batch (\d+)\)", ln).groups()
               for ln in lines if "resuming from step" in ln}
    assert len(resumed) == 1, lines
    step, batch = map(int, resumed.pop())
    assert target - 1 <= step == batch < PER_EPOCH, "mid-epoch 1, from the newest step both ranks stored"
    store_from_settings(store_settings).get_file(f"jobs/{job}/outputs/0/model.pt", tmp_path / "model.pt")
    assert_bitwise_equal(model(tmp_path / "model.pt"), reference)

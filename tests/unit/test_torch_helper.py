"""The learner-side helper: paths from the environment, checkpoints, the halt flag."""

from __future__ import annotations

import json
import signal

import pytest

from tests.servers import wait_for
from trainforge_frameworks.torch import helper

# torch warns at import time when numpy is not installed; numpy is not needed here.
pytestmark = pytest.mark.filterwarnings("ignore:Failed to initialize NumPy:UserWarning")


@pytest.fixture
def learner_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for var in ("TF_CHECKPOINT_DIR", "TF_OUTPUT_DIR", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_dirs_fall_back_to_the_working_directory(learner_env):
    assert helper.checkpoint_dir().resolve() == (learner_env / "checkpoints").resolve()
    assert helper.output_dir("results").resolve() == (learner_env / "results").resolve()
    assert (learner_env / "checkpoints").is_dir() and (learner_env / "results").is_dir()


def test_dirs_and_ranks_come_from_the_environment(learner_env, monkeypatch):
    monkeypatch.setenv("TF_CHECKPOINT_DIR", str(learner_env / "ck"))
    monkeypatch.setenv("TF_OUTPUT_DIR", str(learner_env / "out"))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert helper.checkpoint_dir() == learner_env / "ck"
    assert helper.output_dir("ignored") == learner_env / "out"
    assert (helper.rank(), helper.world_size()) == (3, 4)


def test_not_distributed_without_world_size(learner_env):
    assert (helper.rank(), helper.world_size()) == (0, 1)
    assert helper.init_distributed() is False


def test_device_and_backend_follow_what_torch_sees(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert helper.device() == torch.device("cpu") and helper.distributed_backend() == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # the learner's own GPUs are renumbered from 0 by CUDA_VISIBLE_DEVICES, whatever its rank
    assert helper.device() == torch.device("cuda", 0)
    assert helper.distributed_backend() == ("nccl" if torch.distributed.is_nccl_available() else "gloo")


def test_init_distributed_picks_the_backend_for_the_device(learner_env, monkeypatch):
    import torch.distributed as dist

    joined = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: joined.update(kw))
    monkeypatch.setattr(helper, "distributed_backend", lambda: "nccl")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert helper.init_distributed() is True and joined["backend"] == "nccl"
    assert helper.init_distributed("gloo") is True and joined["backend"] == "gloo"
    assert (joined["rank"], joined["world_size"]) == (1, 2)


def test_bad_rank_is_named(learner_env, monkeypatch):
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ValueError, match="RANK='one' is not an integer"):
        helper.rank()


def test_checkpoint_round_trip_keeps_only_the_latest(learner_env):
    import torch

    assert helper.load_checkpoint() is None
    helper.save_checkpoint({"w": torch.arange(3.0), "epoch": 1}, step=10)
    path = helper.save_checkpoint({"w": torch.arange(4.0), "epoch": 2}, step=20)
    state, step = helper.load_checkpoint()
    assert step == 20
    assert state["epoch"] == 2 and torch.equal(state["w"], torch.arange(4.0))
    assert sorted(p.name for p in path.parent.iterdir()) == [helper.CHECKPOINT_META, helper.CHECKPOINT_FILE]


def test_failed_checkpoint_write_leaves_the_previous_one(learner_env):
    import torch

    helper.save_checkpoint({"w": torch.ones(2)}, step=1)
    with pytest.raises(Exception):  # noqa: B017 - whatever pickling raises
        helper.save_checkpoint({"f": lambda: None}, step=2)
    state, step = helper.load_checkpoint()
    assert step == 1 and torch.equal(state["w"], torch.ones(2))
    assert sorted(p.name for p in helper.checkpoint_dir().iterdir()) == [helper.CHECKPOINT_META, helper.CHECKPOINT_FILE]


def test_negative_step_is_refused(learner_env):
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        helper.save_checkpoint({}, step=-1)


@pytest.fixture
def halt_flag():
    previous = signal.getsignal(signal.SIGUSR1)
    helper._halt_requested.clear()  # noqa: SLF001 - the flag is process-wide
    yield
    signal.signal(signal.SIGUSR1, previous)
    helper._halt_requested.clear()  # noqa: SLF001


def test_should_halt_after_the_signal(halt_flag):
    helper.install_halt_handler(signal.SIGUSR1)
    assert helper.should_halt() is False
    signal.raise_signal(signal.SIGUSR1)
    wait_for(helper.should_halt, 5, "the halt flag")


def test_checkpoint_meta_names_the_step_and_steps_never_go_back(learner_env):
    import torch

    assert helper.last_step() is None and helper.step_in(learner_env) is None
    helper.save_checkpoint({"w": torch.ones(1)}, step=5)
    assert helper.last_step() == 5 == helper.step_in(helper.checkpoint_dir())
    meta = json.loads((helper.checkpoint_dir() / helper.CHECKPOINT_META).read_text())
    assert meta["step"] == 5 and meta["saved_at"] > 0
    helper.save_checkpoint({"w": torch.ones(1)}, step=5)  # the same step again is fine (a re-save)
    with pytest.raises(ValueError, match="step 4 is before the last checkpoint's step 5"):
        helper.save_checkpoint({"w": torch.ones(1)}, step=4)
    assert helper.last_step() == 5


def test_checkpoint_due_follows_the_interval(learner_env, monkeypatch):
    import torch

    monkeypatch.delenv("TF_CHECKPOINT_INTERVAL", raising=False)
    assert helper.checkpoint_due() is False  # no interval: never
    monkeypatch.setenv("TF_CHECKPOINT_INTERVAL", "0.2")
    helper.save_checkpoint({"w": torch.ones(1)}, step=1)
    assert helper.checkpoint_due() is False
    wait_for(helper.checkpoint_due, 5, "the interval to pass")
    helper.save_checkpoint({"w": torch.ones(1)}, step=2)
    assert helper.checkpoint_due() is False
    monkeypatch.setenv("TF_CHECKPOINT_INTERVAL", "soon")
    with pytest.raises(ValueError, match="TF_CHECKPOINT_INTERVAL='soon' is not a number"):
        helper.checkpoint_due()


def test_checkpoint_json_is_gone_while_the_checkpoint_file_is_replaced(learner_env, monkeypatch):
    import os

    import torch

    helper.save_checkpoint({"w": torch.ones(1)}, step=1)
    directory = helper.checkpoint_dir()
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((os.path.basename(dst), (directory / helper.CHECKPOINT_META).exists()))
        real_replace(src, dst)

    monkeypatch.setattr(helper.os, "replace", replace)
    helper.save_checkpoint({"w": torch.zeros(1)}, step=2)
    # a copier that found checkpoint.json (step 1) unchanged before and after copying saw no new file
    assert seen == [(helper.CHECKPOINT_FILE, False), (helper.CHECKPOINT_META, False)]
    assert helper.last_step() == 2 and not [p for p in directory.iterdir() if p.name.startswith(".")]


def test_checkpoint_due_counts_from_the_start_and_zero_means_never(learner_env, monkeypatch):
    import time

    monkeypatch.setattr(helper, "_last_save", time.monotonic() - 100)  # as if started 100 s ago, never saved
    monkeypatch.setenv("TF_CHECKPOINT_INTERVAL", "60")
    assert helper.checkpoint_due() is True
    monkeypatch.setenv("TF_CHECKPOINT_INTERVAL", "0")
    assert helper.checkpoint_due() is False
    monkeypatch.setenv("TF_CHECKPOINT_INTERVAL", "300")
    assert helper.checkpoint_due() is False


EXITING_LEARNER = """
import atexit, sys
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from trainforge_frameworks.torch import helper

atexit.register(lambda: print("atexit ran", flush=True))
if helper.init_distributed("gloo"):
    model = DistributedDataParallel(nn.Linear(4, 2))
    model(torch.randn(3, 4)).sum().backward()
    helper.leave_distributed()
print("finished, no newline yet", end="")
helper.exit_learner(int(sys.argv[1]))
"""


def _run_learners(tmp_path, world: int, code: int) -> list[tuple[int, str]]:
    import os
    import socket
    import subprocess
    import sys

    script = tmp_path / "learner.py"
    script.write_text(EXITING_LEARNER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore"}
        if world == 1:
            env.pop("WORLD_SIZE")
        procs.append(subprocess.Popen([sys.executable, str(script), str(code)], env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs, strict=True)]


def test_exit_learner_after_ddp_flushes_and_skips_the_interpreter_teardown(tmp_path):
    for status, out in _run_learners(tmp_path, 2, 3):
        assert status == 3, out
        assert "finished, no newline yet" in out and "atexit ran" not in out, out


def test_exit_learner_without_a_process_group_exits_normally(tmp_path):
    [(status, out)] = _run_learners(tmp_path, 1, 4)
    assert status == 4, out
    assert "finished, no newline yet" in out and "atexit ran" in out, out

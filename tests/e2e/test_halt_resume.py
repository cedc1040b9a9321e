"""Halt, resume and restart of the example job through the whole embedded stack.

The example (examples/mnist, 2 learners, DDP over gloo) trains with fixed
seeds, so its final model is a function of its inputs: a run that was
halted and resumed, or whose learner was killed and restarted from its
last periodic checkpoint, must end with a model bitwise equal to an
uninterrupted run's, and its step counter must never go back. Each run
checks what its learners ran in: the sandbox wherever this machine allows
one (docs/THREAT_MODEL.md), so these runs show DDP, halt/resume and
restart working inside it.
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.e2e.test_embedded_stack import ROOT, cli_json, stack_processes, wait_terminal
from tests.servers import wait_for
from trainforge_services.common import isolation

EXAMPLE = ROOT / "examples" / "mnist"
# Small enough for 2 CPU cores, and in short epochs, so that a halt or a kill sent after the first one (a
# CLI call or two later: about a second on a quiet machine) still lands well before the last one ends.
EPOCHS = 8
COMMAND = f"python train.py --epochs {EPOCHS} --seed 0 --train-samples 3000 --test-samples 400"


def example(tmp_path: Path, name: str, *, interval: str = "20s") -> Path:
    """A copy of the example with a smaller data set and its own name and checkpoint interval."""
    work = tmp_path / name
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("results", "checkpoints", "__pycache__"))
    manifest = (work / "manifest.yaml").read_text()
    lines = []
    for line in manifest.splitlines():
        if line.startswith("name:"):
            line = f"name: {name}"
        elif line.startswith("command:"):
            line = f"command: {COMMAND}"
        elif line.startswith("checkpoint:"):
            line = f"checkpoint: {{interval: {interval}}}"
        lines.append(line)
    (work / "manifest.yaml").write_text("\n".join(lines) + "\n")
    return work / "manifest.yaml"


def model_of(state: Path, job_id: str) -> dict:
    return torch.load(state / "objects" / "jobs" / job_id / "outputs" / "0" / "model.pt", weights_only=True)


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"


def log_text(env, job_id: str) -> str:
    return "\n".join(line["line"] for line in cli_json(env, "logs", job_id)["lines"])


def assert_isolated(job: dict) -> None:
    """Every learner ran in the sandbox where this machine can give one (else "none", said as such)."""
    expected = "none" if isolation.unavailable() else "sandbox"
    assert [ln["isolation"] for ln in job["learners"]] == [expected] * len(job["learners"]), job["learners"]


def learner_pids(stack_id: str, job_id: str) -> list[psutil.Process]:
    found = []
    for p in stack_processes(stack_id):
        try:
            if p.environ().get("TF_JOB_ID") == job_id and "train.py" in " ".join(p.cmdline()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(scope="module")
def reference(stack, tmp_path_factory):
    """The uninterrupted run every other run is compared with."""
    env, state, _ = stack
    manifest = example(tmp_path_factory.mktemp("ref"), "mnist-reference")
    job_id = cli_json(env, "submit", str(manifest))["id"]
    job = wait_terminal(env, job_id, 300)
    assert job["state"] == "completed", job
    assert len(job["learners"]) == 2
    assert_isolated(job)
    return model_of(state, job_id)


def test_a_halted_and_resumed_job_ends_with_the_uninterrupted_model(stack, reference, tmp_path):
    env, state, stack_id = stack
    job_id = cli_json(env, "submit", str(example(tmp_path, "mnist-halted")))["id"]
    # halt after the first epoch ended, with several still to go
    wait_for(lambda: f"epoch 1/{EPOCHS}" in log_text(env, job_id), 240, "the first epoch to end", interval=1.0)
    halted = cli_json(env, "halt", job_id, timeout=180)
    assert halted["state"] == "halted", halted
    assert halted["checkpoint_step"] is not None and halted["checkpoint_step"] > 0
    wait_for(lambda: not learner_pids(stack_id, job_id), 30, "the learners to be gone")
    assert [ln["state"] for ln in halted["learners"]] == ["halted", "halted"], halted["learners"]

    resumed = cli_json(env, "resume", job_id)
    assert (resumed["state"], resumed["attempt"]) == ("queued", 2)
    job = wait_terminal(env, job_id, 300)
    assert job["state"] == "completed", job
    walked = [h["to"] for h in job["history"]]
    assert walked == ["pending", "queued", "deploying", "running", "halting", "halted", "queued", "deploying",
                      "running", "storing", "completed"], walked
    text = log_text(env, job_id)
    assert f"resuming from step {halted['checkpoint_step']}" in text
    assert_isolated(job)
    assert_bitwise_equal(model_of(state, job_id), reference)


def test_a_killed_learner_restarts_from_its_checkpoint(stack, reference, tmp_path):
    env, state, stack_id = stack
    job_id = cli_json(env, "submit", str(example(tmp_path, "mnist-killed", interval="2s")))["id"]
    wait_for(lambda: f"epoch 1/{EPOCHS}" in log_text(env, job_id), 240, "the first epoch to end", interval=1.0)
    victims = wait_for(lambda: learner_pids(stack_id, job_id), 30, "the learners' processes")
    killed_at = time.monotonic()
    victims[-1].send_signal(signal.SIGKILL)
    wait_for(lambda: cli_json(env, "status", job_id)["attempt"] == 2
             and cli_json(env, "status", job_id)["state"] == "running", 120, "attempt 2 to run", interval=0.5)
    print(f"recovered in {time.monotonic() - killed_at:.1f}s")
    job = wait_terminal(env, job_id, 300)
    assert job["state"] == "completed", job
    assert job["restarts"] == 1
    assert any(h["to"] == "restarting" and "restart 1 of 2" in h["reason"] for h in job["history"])
    assert "resuming from step" in log_text(env, job_id)
    assert_isolated(job)
    assert_bitwise_equal(model_of(state, job_id), reference)

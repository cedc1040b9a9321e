"""The simulated backend (TF_BACKEND=simulated) behind the whole embedded stack: real Trainer, LCM, store, etcd.

Jobs go QUEUED -> DEPLOYING -> RUNNING -> STORING -> COMPLETED through the
Trainer's ReportJobStatus path without any process started for them; the
capacity setting holds jobs in the queue; a cancelled job's KillJob stops its
simulation, so it never completes afterwards.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.e2e.test_embedded_stack import cli_json, run_cli, stack_processes, wait_terminal
from tests.servers import wait_for

SECONDS = 3


@pytest.fixture(scope="module")
def sim_stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("tf-sim")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env.update(TF_STATE_DIR=str(state), PYTHONUNBUFFERED="1", TF_BACKEND="simulated",
               TF_SIM_SECONDS=str(SECONDS), TF_SIM_MAX_LEARNERS="2")
    run_cli(env, "up", timeout=180)
    stack_id = json.loads((state / "stack.json").read_text())["stack_id"]
    yield env, stack_id
    run_cli(env, "down", timeout=120, check=False)


def manifest(tmp_path, name: str, learners: int, seconds: float | None = None):
    """A job of `learners`; `seconds`: how long it runs (its own SIM_SECONDS), long enough for a slow poll to
    see it RUNNING on a loaded machine."""
    path = tmp_path / f"{name}.yaml"
    own = f"env: {{SIM_SECONDS: '{seconds}'}}\n" if seconds is not None else ""
    path.write_text(f"name: {name}\nframework: custom\nlearners: {learners}\n{own}"
                    "resources: {cpus: 0.5, memory: 64Mi}\ncommand: python -c 'never run'\n")
    return str(path)


def state_of(env, job_id: str) -> str:
    return cli_json(env, "status", job_id)["state"]


def test_a_job_walks_the_main_line_without_a_process(sim_stack, tmp_path):
    env, stack_id = sim_stack
    job_id = cli_json(env, "submit", manifest(tmp_path, "sim", 2))["id"]
    job = wait_terminal(env, job_id, 120)
    assert [h["to"] for h in job["history"]] == ["pending", "queued", "deploying", "running", "storing", "completed"]
    assert {h["actor"] for h in job["history"][-3:]} == {"simulated"}
    assert not [p for p in stack_processes(stack_id)
                if any("trainforge_services.controller" in part or "trainforge_services.jobmonitor" in part
                       for part in p.cmdline())]


def test_capacity_holds_jobs_in_the_queue(sim_stack, tmp_path):
    env, _ = sim_stack
    first = cli_json(env, "submit", manifest(tmp_path, "first", 2, seconds=40))["id"]
    wait_for(lambda: state_of(env, first) == "running", 180, "the first job to run", interval=0.3)
    second = cli_json(env, "submit", manifest(tmp_path, "second", 2))["id"]
    waiting = wait_for(lambda: (j := cli_json(env, "status", second))["state"] == "queued" and j["reason"] and j,
                       30, "the second job to wait with a reason", interval=0.3)
    assert state_of(env, first) == "running", waiting
    assert wait_terminal(env, first, 120)["state"] == "completed"
    assert wait_terminal(env, second, 60)["state"] == "completed"


def test_a_cancelled_job_never_completes(sim_stack, tmp_path):
    env, _ = sim_stack
    job_id = cli_json(env, "submit", manifest(tmp_path, "cancelled", 1, seconds=20))["id"]
    wait_for(lambda: state_of(env, job_id) == "running", 180, "the job to run", interval=0.3)
    assert cli_json(env, "cancel", job_id)["state"] == "cancelled"
    # a job submitted afterwards ran its whole simulated time: the cancelled one's would have ended too
    later = cli_json(env, "submit", manifest(tmp_path, "later", 1, seconds=25))["id"]
    assert wait_terminal(env, later, 120)["state"] == "completed"
    job = cli_json(env, "status", job_id)
    assert job["state"] == "cancelled" and "completed" not in [h["to"] for h in job["history"]]

"""Quota borrowing and preemption by checkpoint through the whole embedded stack.

Team nlp (1 CPU of its own) borrows team vision's idle quota (2 CPUs, same
cohort) to run the example (2 learners x 1 CPU). When vision submits, the
scheduler halts nlp's job (a final checkpoint, not a kill) with the reason,
runs vision's job, and nlp's job comes back on its own and completes, its
model bitwise equal to an uninterrupted run's (tests/e2e/test_halt_resume.py
compares them the same way).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.e2e.test_embedded_stack import cli_json, run_cli, wait_terminal
from tests.e2e.test_halt_resume import EPOCHS, assert_bitwise_equal, example, log_text, model_of
from tests.servers import wait_for

MIN_RUNTIME = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The embedded stack with a short minimum runtime and room for two example jobs at once."""
    state = tmp_path_factory.mktemp("tf-state")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env.update(TF_STATE_DIR=str(state), PYTHONUNBUFFERED="1", TF_PREEMPT_MIN_RUNTIME=str(MIN_RUNTIME),
               TF_LOCAL_CPUS="8")
    run_cli(env, "up", timeout=180)
    stack_id = json.loads((state / "stack.json").read_text())["stack_id"]
    yield env, state, stack_id
    run_cli(env, "down", timeout=120, check=False)


def team_env(admin: dict, team: str) -> dict:
    cli_json(admin, "admin", "teams", "create", team)
    issued = cli_json(admin, "admin", "keys", "create", f"{team}-ci", "--team", team)
    return {**admin, "TRAINFORGE_API_KEY": issued["key"]}


def test_a_borrower_is_halted_for_the_owner_and_resumes_to_the_uninterrupted_model(stack, tmp_path):
    env, state, _ = stack
    bootstrap = json.loads(run_cli(env, "admin", "bootstrap", "--team", "ops", "--json").stdout)
    admin = {**env, "TRAINFORGE_API_KEY": bootstrap["key"]}
    nlp, vision = team_env(admin, "nlp"), team_env(admin, "vision")
    cli_json(admin, "admin", "quota", "set", "nlp", "--cpus", "1", "--cohort", "lab")
    cli_json(admin, "admin", "quota", "set", "vision", "--cpus", "2", "--cohort", "lab")

    reference = cli_json(env, "submit", str(example(tmp_path, "mnist-reference")))["id"]
    borrower = cli_json(nlp, "submit", str(example(tmp_path, "mnist-borrower")))["id"]
    wait_for(lambda: cli_json(nlp, "status", borrower)["state"] == "running", 120, "the borrower to run")
    job = cli_json(nlp, "status", borrower)
    assert job["borrowed"] == {"cohort": "lab", "gpus": 0, "cpus": 1.0, "memory": 0}, job["borrowed"]
    usage = {r["team"]: r for r in cli_json(admin, "admin", "usage")}
    assert usage["nlp"]["borrowed"]["cpus"] == 1.0 and usage["vision"]["borrowed"]["cpus"] == 0
    assert usage["nlp"]["quota"]["cohort"] == "lab"

    # the owner submits in the borrower's second epoch, after its first checkpoint
    wait_for(lambda: f"epoch 1/{EPOCHS}" in log_text(nlp, borrower), 300, "the first epoch to end", interval=1.0)
    owner_manifest = tmp_path / "owner.yaml"
    owner_manifest.write_text("name: owner\nlearners: 2\nresources: {cpus: 1, memory: 1Gi}\n"
                              "command: python -c \"print('vision ran')\"\n")
    owner = cli_json(vision, "submit", str(owner_manifest))["id"]

    def was_halted() -> dict | None:
        job = cli_json(nlp, "status", borrower)
        return job if any(h["to"] == "halted" for h in job["history"]) else None

    try:
        halted = wait_for(was_halted, 180, "the borrower to be halted", interval=0.5)
    except TimeoutError:
        raise AssertionError(json.dumps([cli_json(nlp, "status", borrower), cli_json(vision, "status", owner)],
                                        indent=1)) from None
    assert halted["restarts"] == 0 and halted["checkpoint_step"] and halted["checkpoint_step"] > 0
    finished = wait_terminal(vision, owner, 180)
    assert finished["state"] == "completed", finished
    assert any(f"preempting {borrower}" in h["reason"] for h in finished["history"]), finished["history"]

    done = wait_terminal(nlp, borrower, 400)
    assert done["state"] == "completed", done
    walked = [h["to"] for h in done["history"]]
    assert walked == ["pending", "queued", "deploying", "running", "halting", "halted", "queued", "deploying",
                      "running", "storing", "completed"], walked
    halting = done["history"][4]
    assert (halting["reason"], halting["actor"]) == \
        ("preempted: halted to return 2 CPUs to team vision; the learners are checkpointing", "scheduler")
    assert "requeued first in team nlp's queue as attempt 2" in done["history"][6]["reason"]
    assert done["preemptions"] == 1 and done["preempted"] == ""
    assert f"resuming from step {halted['checkpoint_step']}" in log_text(nlp, borrower)

    ref = wait_terminal(env, reference, 400)
    assert ref["state"] == "completed", ref
    assert_bitwise_equal(model_of(state, borrower), model_of(state, reference))

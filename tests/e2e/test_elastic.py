"""An elastic job through the whole embedded stack: it loses a learner, runs on smaller, grows back, completes.

The job (examples/elastic: a linear model, gloo, a checkpoint every 5 steps)
asks for `learners: {min: 1, max: 2}`. Both start (the local backend has
room); the controller of slot 1 is SIGKILLed mid-run. The job must not
fail: slot 0's torchrun agent re-forms a group of 1 and resumes from its
checkpoint, the LCM starts slot 1 again after its refill delay, the group
re-forms at 2 and the job completes. Meanwhile `world_size` in the REST
shape shows fewer learners running than targeted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
from pathlib import Path

import psutil
import pytest

from tests.e2e.test_embedded_stack import ROOT, cli_json, stack_processes, wait_terminal
from tests.servers import wait_for
from trainforge.sdk import Client

EXAMPLE = ROOT / "examples" / "elastic"


def elastic_job(tmp_path: Path) -> Path:
    work = tmp_path / "elastic"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("outputs", "checkpoints", "__pycache__"))
    text = (work / "manifest.yaml").read_text()
    text = text.replace("learners: {min: 1, max: 3}", "learners: {min: 1, max: 2}")
    text = text.replace("params: {steps: 300}", "params: {steps: 400}")
    (work / "manifest.yaml").write_text(text)
    return work / "manifest.yaml"


def controller_of(stack_id: str, job_id: str, slot: int) -> psutil.Process | None:
    for p in stack_processes(stack_id):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "trainforge_services.controller" in cmd and f"/{job_id}/" in cmd and cmd.endswith(f"learner-{slot}.json"):
            return p
    return None


class Sizes(threading.Thread):
    """Records every distinct (state, current, target) the REST shape shows, polling fast."""

    def __init__(self, client: Client, job_id: str):
        super().__init__(daemon=True)
        self.client, self.job_id = client, job_id
        self.seen: list[tuple[str, int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                job = self.client.get(self.job_id)
            except Exception:  # noqa: BLE001 - a slow API call is retried at the next poll
                self.stop.wait(0.2)
                continue
            world = job.get("world_size") or {}
            sample = (job["state"], world.get("current", -1), world.get("target", -1))
            if not self.seen or self.seen[-1] != sample:
                self.seen.append(sample)
            self.stop.wait(0.2)


def world_lines(env, job_id: str) -> list[str]:
    return [line["line"] for line in cli_json(env, "logs", job_id)["lines"] if re.match(r"world \d+:", line["line"])]


@pytest.mark.timeout(600)
def test_elastic_job_shrinks_on_a_lost_learner_and_grows_back(stack, tmp_path):
    env, state, stack_id = stack
    submitted = cli_json(env, "submit", str(elastic_job(tmp_path)))
    job_id = submitted["id"]
    config = json.loads((state / "config.json").read_text())
    client = Client(config["api_url"], config["api_key"])
    sizes = Sizes(client, job_id)
    sizes.start()
    try:
        # both learners train (a checkpoint was saved in a group of 2)
        wait_for(lambda: any(ln.startswith("world 2: rank 0 saved") for ln in world_lines(env, job_id)), 240,
                 "the job to train with 2 learners", interval=1.0)
        victim = wait_for(lambda: controller_of(stack_id, job_id, 1), 30, "slot 1's controller")
        os.kill(victim.pid, signal.SIGKILL)
        # slot 0 runs on alone from its checkpoint, then slot 1 is back and the group is 2 again
        wait_for(lambda: any(ln.startswith("world 1: rank 0 starts") for ln in world_lines(env, job_id)),
                 120, "the job to run on with 1 learner", interval=1.0)
        wait_for(lambda: any(ln.startswith("world 2: rank 0 starts at step") and not ln.endswith("step 0")
                             for ln in world_lines(env, job_id)),
                 180, "the job to grow back to 2 learners", interval=1.0)
        job = wait_terminal(env, job_id, 300)
    finally:
        sizes.stop.set()
        sizes.join(10)
        client.close()
    assert job["state"] == "completed", job["reason"]
    assert job["world_size"] == {"current": 2, "target": 2, "min": 1, "max": 2}
    assert any(current < target for s, current, target in sizes.seen if s == "running"), sizes.seen
    lines = world_lines(env, job_id)
    # the step never went back: each (re)start of a learner resumed from the newest checkpoint any learner
    # held (checked per learner: a finished job's log may come from the archives, one learner after another)
    for slot in (0, 1):
        mine = [line["line"] for line in cli_json(env, "logs", job_id, "--learner", str(slot))["lines"]]
        starts = [int(m.group(1)) for ln in mine if (m := re.search(r"starts at step (\d+)", ln))]
        assert starts and starts == sorted(starts), (slot, starts)
    assert any(ln.startswith("world 2: rank 0 done at step 400") for ln in lines), lines
    # the final group's rank 0 saves the model; after a regrouping torchrun may give rank 0 to either slot
    models = sorted((state / "objects" / "jobs" / job_id / "outputs").glob("*/model.pt"))
    assert len(models) == 1, models


def starts_per_learner(env, job_id: str) -> dict[int, list[int]]:
    """The steps each learner's runs started at, in order (every attempt)."""
    out = {}
    for slot in (0, 1):
        mine = [line["line"] for line in cli_json(env, "logs", job_id, "--learner", str(slot))["lines"]]
        out[slot] = [int(m.group(1)) for ln in mine if (m := re.search(r"starts at step (\d+)", ln))]
    return out


@pytest.mark.timeout(600)
def test_an_elastic_job_halts_and_resumes_and_its_step_never_goes_back(stack, tmp_path):
    env, state, stack_id = stack
    job_id = cli_json(env, "submit", str(elastic_job(tmp_path)))["id"]
    wait_for(lambda: any(ln.startswith("world 2: rank 0 saved") for ln in world_lines(env, job_id)), 240,
             "the job to train with 2 learners", interval=1.0)
    halted = cli_json(env, "halt", job_id, timeout=180)
    assert halted["state"] == "halted", halted
    step = halted["checkpoint_step"]
    assert step is not None and step > 0, halted
    assert {ln["state"] for ln in halted["learners"] if ln["attempt"] == 1} <= {"halted", "completed"}, halted
    wait_for(lambda: all(controller_of(stack_id, job_id, slot) is None for slot in (0, 1)), 30,
             "the learners to be gone")
    before = starts_per_learner(env, job_id)

    resumed = cli_json(env, "resume", job_id)
    assert (resumed["state"], resumed["attempt"]) == ("queued", 2)
    job = wait_terminal(env, job_id, 400)
    assert job["state"] == "completed", job["reason"]
    walked = [h["to"] for h in job["history"]]
    assert walked[walked.index("halting"):walked.index("halting") + 4] == ["halting", "halted", "queued",
                                                                           "deploying"], walked
    # the resumed attempt started from the halt's checkpoint, and no learner's step ever went back
    after = starts_per_learner(env, job_id)
    for slot in (0, 1):
        assert after[slot] == sorted(after[slot]), (slot, after[slot])
    resumed_starts = [s for slot in (0, 1) for s in after[slot][len(before[slot]):]]
    assert resumed_starts and min(resumed_starts) >= step, (step, before, after)
    assert any(ln.startswith("world 2: rank 0 done at step 400") or ln.startswith("world 1: rank 0 done at step 400")
               for ln in world_lines(env, job_id))
    assert len(sorted((state / "objects" / "jobs" / job_id / "outputs").glob("*/model.pt"))) == 1

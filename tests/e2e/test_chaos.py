"""Chaos: 50 jobs while the API, the Trainer, the LCM, job monitors and controllers are SIGKILLed in turn.

The embedded stack runs as subprocesses, as `trainforge up` starts it, with
short leases so a dead controller is noticed within seconds. A seeded
schedule (CHAOS_SEED) SIGKILLs one piece at a time at random moments, the
first while the burst is still being submitted:

* api, trainer, lcm: started again as `trainforge up` does (only what is
  not running, same ports, same data);
* a job monitor: started again by the LCM's supervision, resuming from etcd;
* a controller: its learner is lost; the restart policy redeploys it, or the
  job fails ("learner r lost") when it allows no restart.

The jobs: one- and two-learner sleepers of random length, some exiting 3 on
purpose, some allowed two restarts with a 1 s backoff, and four long ones
whose learner leaves its process group (`setsid`): the controllers killed
are theirs, so a learner orphaned by its controller's death must be found
and removed by the LCM before the next attempt starts or the job ends. Submits carry an Idempotency-Key, so a
submit retried across an API restart cannot create a second job.

A thread samples the process table throughout: no job may ever have
controllers or learners of two attempts alive at once, nor two copies of
one learner. At the end every job must have entered a terminal state exactly
once, along a legal chain with a reason, and MongoDB, etcd, the LCM's
records and the process table must agree that nothing of them is left.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.chaos_support import (
    TERMINAL,
    ChaosStack,
    ProcessWatch,
    assert_everything_agrees,
    check_history,
    diagnose,
)
from tests.servers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(540)]

SEED = int(os.environ.get("CHAOS_SEED", "20260514"))
JOBS = 50
# Short leases and graces: a killed controller is noticed within seconds, KillJob is quick.
SETTINGS = {"TF_LEASE_TTL": "4", "TF_KILL_GRACE": "3", "TF_REPORT_RETRY_SECONDS": "0.5"}
# One of each, in this order, then a second round; each after a random pause.
VICTIMS = ["api", "controller", "monitor", "trainer", "controller", "lcm", "monitor", "trainer", "lcm", "api"]
# A job whose controller was killed and which allows no restart ends FAILED for one of these reasons.
LOST = re.compile(r"lost|without reporting")


@dataclass(frozen=True)
class Planned:
    name: str
    learners: int
    seconds: float
    exit_code: int
    max_restarts: int
    through_shell: bool

    def manifest(self) -> dict:
        program = f"import sys, time; time.sleep({self.seconds:.2f}); print('done'); sys.exit({self.exit_code})"
        command = f"python -c \"{program}\""
        if self.seconds == LONG_SECONDS:
            command = f"setsid {command}"  # leaves the learner's process group: only the LCM can find it
        elif self.through_shell:
            command = f"true && {command}"
        return {"name": self.name, "framework": "custom", "learners": self.learners,
                "resources": {"cpus": 0.25, "memory": "128Mi"}, "command": command,
                "restart": {"max_restarts": self.max_restarts, "backoff": "1s"}}


# Long one-learner jobs, the controllers' victims: (max_restarts) by index. Their learner leaves its
# process group (setsid), so nothing the controller arranged for its own death reaches it, and it
# outlives the moment its lost controller is noticed: left running, it would overlap the next attempt
# or outlive the job's end, both of which the process watch flags. The LCM's KillJob must find it.
LONG = {1: 0, 2: 2, 6: 0, 8: 2}
LONG_SECONDS = 45.0


def plan(rng: random.Random) -> list[Planned]:
    jobs = []
    for i in range(JOBS):
        fails = i % 10 in (3, 7)
        long = i in LONG
        jobs.append(Planned(
            name=f"chaos-{i:02d}", learners=2 if i % 5 == 0 and not long else 1,
            seconds=LONG_SECONDS if long else rng.uniform(1.0, 4.0),
            exit_code=3 if fails else 0,
            # the failing ones: one allowed no restart, one allowed one (it fails twice)
            max_restarts=LONG[i] if long else {3: 0, 7: 1}.get(i % 10, 2 if i % 3 == 0 else 0),
            through_shell=i % 4 == 1))
    return jobs


@pytest.fixture(scope="module")
def chaos(tmp_path_factory):
    with ChaosStack.running(tmp_path_factory.mktemp("tf-chaos"), SETTINGS) as c:
        yield c


def submit_all(chaos: ChaosStack, jobs: list[Planned], ids: dict[str, str], errors: list[BaseException]) -> None:
    """Submit the burst (in a thread: the API may be killed meanwhile); a retry reuses the Idempotency-Key."""
    client = chaos.new_client()
    try:
        for p in jobs:
            job = chaos.call(client.submit, p.manifest(), idempotency_key=f"{SEED}-{p.name}")
            ids[p.name] = job["id"]
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)
    finally:
        client.close()


def kill_in_turn(chaos: ChaosStack, rng: random.Random, jobs: dict[str, Planned], ids: dict[str, str]
                 ) -> dict[str, list[dict]]:
    """SIGKILL each victim after a random pause; returns the controller and monitor victims."""
    by_id = {}
    victims: dict[str, list[dict]] = {"controller": [], "monitor": []}
    for n, victim in enumerate(VICTIMS):
        # a random moment to strike (not a wait for a condition); the first while the burst is submitted
        time.sleep(rng.uniform(0.5, 2.0) if n == 0 else rng.uniform(2.0, 5.0))
        if victim in ("api", "trainer", "lcm"):
            chaos.kill_component(victim)
            continue
        by_id.update({i: jobs[name] for name, i in list(ids.items())})
        module = "controller" if victim == "controller" else "jobmonitor"
        # controllers: of a long job allowing no restart first, then of one allowing two
        wanted = (0 if not victims["controller"] else 2) if victim == "controller" else None

        def choose(spec: dict, wanted=wanted, victim=victim) -> bool:
            planned = by_id.get(spec["job_id"])
            if planned is None or planned.exit_code:
                return False
            if victim == "monitor":
                return not (Path(spec["attempt_dir"]) / "monitor.done").exists()
            return planned.seconds == LONG_SECONDS and planned.max_restarts == wanted and spec["attempt"] == 1

        hit = None
        # long enough for a loaded machine (other tests' stacks on other workers) to have started such a job
        deadline = time.monotonic() + 60
        while hit is None and time.monotonic() < deadline:
            hit = chaos.kill_one(module, rng, choose)
            time.sleep(0 if hit else 0.2)  # polling for a process to appear, not a fixed wait
        if hit is not None:
            victims[victim].append(hit)
    return victims


def test_fifty_jobs_survive_every_service_being_sigkilled_in_turn(chaos):
    rng = random.Random(SEED)
    jobs = plan(rng)
    planned = {p.name: p for p in jobs}
    ids: dict[str, str] = {}
    errors: list[BaseException] = []
    started = time.monotonic()

    with ProcessWatch(chaos.stack_id, jobs=chaos.jobs_of_own_client()) as watch:
        submitter = threading.Thread(target=submit_all, args=(chaos, jobs, ids, errors), daemon=True)
        submitter.start()
        victims = kill_in_turn(chaos, rng, planned, ids)
        submitter.join(120)
        assert not submitter.is_alive() and not errors, f"submitting the burst failed: {errors}"
        killed = [what for _, what, _ in chaos.kills]
        ours = set(ids.values())

        def ended() -> bool:
            return all(j["state"] in TERMINAL for i, j in chaos.jobs().items() if i in ours)
        try:
            wait_for(ended, 240, "every job to end", interval=1.0)
        except TimeoutError:
            stuck = {i: (j["name"], j["state"], j["attempt"], j["reason"][:160]) for i, j in chaos.jobs().items()
                     if j["state"] not in TERMINAL}
            raise AssertionError(f"killed {chaos.kills}; jobs that did not end: {stuck}\n"
                                 f"{diagnose(chaos.state, list(stuck)[:3])}") from None
        elapsed = time.monotonic() - started
    jobs_now = {i: j for i, j in chaos.jobs().items() if i in ours}

    # nothing lost, nothing doubled
    assert {"api", "trainer", "lcm", "controller", "jobmonitor"} <= set(killed), killed
    assert len(ours) == JOBS and set(jobs_now) == ours
    names = sorted(j["name"] for j in chaos.jobs().values())
    assert names == sorted(planned), "a job was lost or submitted twice"
    assert not watch.overlaps, f"attempts of one job alive at once: {watch.overlaps[:5]}"
    assert not watch.duplicates, f"two copies of one learner or controller: {watch.duplicates[:5]}"
    assert not watch.late, f"learners or controllers outlived their job's end: {watch.late[:5]}"
    assert watch.samples > 20

    # every job: terminal exactly once, a legal chain, a reason
    for job in jobs_now.values():
        check_history(job)

    # the outcome, where it is certain
    lost_controller = {v["job_id"] for v in victims["controller"]}
    for job_id, job in jobs_now.items():
        p = planned[job["name"]]
        outcome = (job["name"], job["state"], job["attempt"], job["reason"][:200])
        if p.exit_code:
            assert job["state"] == "failed" and "exited with code 3" in job["reason"], outcome
            assert job["attempt"] == p.max_restarts + 1, outcome
        elif job_id in lost_controller and p.max_restarts == 0:
            # its learner was lost with the controller, unless it had already finished
            assert job["state"] == "completed" or (job["state"] == "failed" and LOST.search(job["reason"])), outcome
        else:
            # undisturbed, or disturbed only by crashes of services that hold no job (api, trainer, lcm,
            # monitors), or covered by the restart policy
            assert job["state"] == "completed", outcome
    assert len(victims["controller"]) == 2, victims
    for v in victims["controller"]:
        if planned_of(jobs_now, planned, v).max_restarts:
            job = jobs_now[v["job_id"]]
            assert job["state"] == "completed" and job["restarts"] >= 1, (job["reason"], job["history"])

    assert_everything_agrees(chaos, set(jobs_now))
    restarted = chaos.log("lcm").count("its monitor died before the attempt ended; starting it again")
    restarts = sum(j["restarts"] for j in jobs_now.values())
    outcomes = {s: sum(j["state"] == s for j in jobs_now.values()) for s in TERMINAL}
    print(f"\nseed {SEED}: {JOBS} jobs ended in {elapsed:.0f}s; kills: "
          + ", ".join(f"{what} ({detail})" for _, what, detail in chaos.kills)
          + f"; outcomes {outcomes}; {restarts} restarts; {restarted} monitor(s) started again by the LCM; "
          f"{watch.samples} process-table samples, attempts seen {sum(map(len, watch.seen.values()))}")


def planned_of(jobs_now: dict[str, dict], planned: dict[str, Planned], victim: dict) -> Planned:
    return planned[jobs_now[victim["job_id"]]["name"]]

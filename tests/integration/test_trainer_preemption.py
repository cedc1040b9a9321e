"""Borrowing in a cohort and preemption by checkpoint, as the Trainer decides them.

A real job store and quota store (the MongoDB-wire server) and dispatcher;
the LCM is the scripted stand-in that records what it is asked, and the job
monitor's reports are made directly. Team a (2 CPUs of its own) borrows
team b's idle quota (4 CPUs, same cohort); b's job takes it back by halting
a's job, which comes back on its own.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.test_trainer_dispatcher import ScriptedLcm
from tests.integration.test_trainer_halt_restart import refs_for, state_of
from tests.servers import wait_for
from trainforge_services.common.states import JobState
from trainforge_services.trainer.job_service import JobService
from trainforge_services.trainer.preemption import Policy
from trainforge_services.trainer.quotas import QuotaStore
from trainforge_services.trainer.resources import BackendSize, Quota, Usage
from trainforge_services.trainer.store import JobStore
from trainforge_services.trainer.wiring import wire

GI = 2**30
MIN_RUNTIME = 1.5


def make_trainer(mongo_db, unique, *, max_preemptions: int = 3):
    store = JobStore(mongo_db, collection=f"jobs_{unique}")
    store.ensure_indexes()
    lcm = ScriptedLcm(BackendSize(Usage(cpus=8, memory=64 * GI, learners=8)))
    quotas = QuotaStore(mongo_db, f"quotas_{unique}")
    core = wire(store, lcm, quotas=quotas, interval=0.1, spacing=0.0, kill_backoff=0.01,
                preemption=Policy(min_runtime=MIN_RUNTIME, max_preemptions=max_preemptions))
    dispatcher = core.dispatcher
    service = JobService(store, core.lifecycle, core.calls, dispatcher, quotas, refs_for(mongo_db, unique))
    service.set_quota("a", Quota(cpus=2, cohort="lab"), "admin")
    service.set_quota("b", Quota(cpus=4, cohort="lab"), "admin")
    dispatcher.start()
    return service, store, lcm, core


@pytest.fixture
def trainer(mongo_db, unique):
    service, store, lcm, core = make_trainer(mongo_db, unique)
    yield service, store, lcm
    core.stop()


@pytest.fixture
def bounded(mongo_db, unique):
    service, store, lcm, core = make_trainer(mongo_db, unique, max_preemptions=1)
    yield service, store, lcm
    core.stop()


def submit(service: JobService, team: str, cpus: float = 2) -> str:
    body = {"name": "train", "command": "python train.py", "learners": 2, "resources": {"cpus": cpus}}
    return service.submit(team, json.dumps(body)).id


def running(service: JobService, store: JobStore, job_id: str, attempt: int = 1) -> None:
    wait_for(lambda: store.find(job_id).attempt == attempt and state_of(store, job_id) == JobState.DEPLOYING,
             10, f"{job_id} attempt {attempt} to deploy")
    service.report(job_id, attempt, JobState.RUNNING, "all 2 learners started", "monitor")


def ran_before_halt(store: JobStore, job_id: str) -> float:
    """Seconds from the deploy of the job's current attempt to its last halt, as the store recorded them."""
    job = store.find(job_id)
    halt = [e.ts for e in job.history if e.to_state == JobState.HALTING][-1]
    return halt - job.active_since


def halted(service: JobService, store: JobStore, job_id: str, attempt: int, step: int) -> None:
    service.report(job_id, attempt, JobState.HALTED, f"all 2 learners halted at step {step}", "monitor",
                   checkpoint_step=step)


def finish(service: JobService, store: JobStore, job_id: str) -> None:
    service.report(job_id, 1, JobState.STORING, "all 2 learners exited 0", "monitor")
    service.report(job_id, 1, JobState.COMPLETED, "all 2 learners completed", "monitor")
    assert state_of(store, job_id) == JobState.COMPLETED


def test_the_owner_reclaims_its_quota_by_halting_the_borrower_which_comes_back_on_its_own(trainer):
    service, store, lcm = trainer
    borrower = submit(service, "a")  # 4 CPUs: 2 of its own, 2 borrowed from b
    running(service, store, borrower)
    job = store.find(borrower)
    assert (job.borrowed, job.cohort) == (Usage(cpus=2), "lab")
    assert job.history[2].reason == "resources reserved (2 CPUs borrowed in cohort lab); deploying"
    assert service.team_usage("a").held.usage.cpus == 4

    owner = submit(service, "b")  # 4 CPUs: all of b's own quota, 2 of them lent out
    wait_for(lambda: state_of(store, borrower) == JobState.HALTING, 10, "the borrower to be halted")
    assert ran_before_halt(store, borrower) >= MIN_RUNTIME, "halted before its minimum runtime"
    victim = store.find(borrower)
    assert victim.reason == "preempted: halted to return 4 CPUs to team b; the learners are checkpointing"
    assert (victim.preemptions, victim.preempted_for) == (1, owner)
    wait_for(lambda: lcm.halts == [(borrower, 1)], 10, "the LCM's halt request")
    assert borrower not in lcm.kill_tries  # halted, not killed
    wait_for(lambda: "being returned by preemption" in store.find(owner).reason, 10, "the owner's reason")
    assert store.find(owner).reason == f"waiting for 4 CPUs being returned by preemption (halting {borrower})"
    assert any(e.to_state == JobState.QUEUED and f"preempting {borrower}" in e.reason
               for e in store.find(owner).history)

    halted(service, store, borrower, 1, 40)
    running(service, store, owner)
    wait_for(lambda: state_of(store, borrower) == JobState.QUEUED, 10, "the borrower to be requeued")
    back = store.find(borrower)
    assert back.attempt == 2 and back.preempted
    assert back.reason == ("preempted: halted to return 4 CPUs to team b; requeued first in team a's queue as "
                           "attempt 2, continues from its checkpoint at step 40")
    # b holds its whole quota: a cannot borrow it back at once (no thrash)
    wait_for(lambda: "cohort lab has 0 to lend" in store.find(borrower).reason, 10, "the borrower's reason")
    assert state_of(store, borrower) == JobState.QUEUED

    finish(service, store, owner)
    running(service, store, borrower, attempt=2)
    # DEPLOYING is stored before the dispatcher's deploy call reaches the stand-in LCM
    wait_for(lambda: (borrower, 2) in lcm.checkpoint_uris, 10, "the deploy to reach the LCM")
    assert lcm.checkpoint_uris[(borrower, 2)] == f"store://jobs/{borrower}/checkpoints/"
    again = store.find(borrower)
    assert (again.preempted, again.preempted_for, again.borrowed) == ("", "", Usage(cpus=2))
    walked = [JobState(e.to_state).name for e in again.history]
    assert walked == ["PENDING", "QUEUED", "DEPLOYING", "RUNNING", "HALTING", "HALTED", "QUEUED", "DEPLOYING",
                      "RUNNING"]


def preempted_once_and_back(service: JobService, store: JobStore, lcm: ScriptedLcm) -> str:
    """Team a's borrower, halted once for team b's job, which then ran and finished: running again (attempt 2)."""
    borrower = submit(service, "a")
    running(service, store, borrower)
    owner = submit(service, "b")
    wait_for(lambda: state_of(store, borrower) == JobState.HALTING, 10, "the first preemption")
    # as a real monitor: HALTED follows the LCM's halt (sent from the Trainer's pool, only while still HALTING)
    wait_for(lambda: (borrower, 1) in lcm.halts, 10, "the LCM's halt request")
    halted(service, store, borrower, 1, 10)
    running(service, store, owner)
    finish(service, store, owner)
    running(service, store, borrower, attempt=2)
    return borrower


def test_a_job_is_not_preempted_again_within_its_minimum_runtime(trainer):
    service, store, lcm = trainer
    borrower = preempted_once_and_back(service, store, lcm)

    second = submit(service, "b")
    wait_for(lambda: state_of(store, borrower) == JobState.HALTING, 10, "the second preemption")
    assert ran_before_halt(store, borrower) >= MIN_RUNTIME, "preempted twice within its minimum runtime"
    assert store.find(borrower).preemptions == 2
    assert store.find(borrower).preempted_for == second


def test_the_preemption_bound_holds(bounded):
    service, store, lcm = bounded
    borrower = preempted_once_and_back(service, store, lcm)

    waiting = submit(service, "b")
    # after several passes beyond its minimum runtime, the borrower (preempted once, the bound) still runs
    wait_for(lambda: "2 lent to cohort lab" in store.find(waiting).reason, 10, "the owner's job to wait")
    deadline = time.monotonic() + 3 * MIN_RUNTIME
    while time.monotonic() < deadline:
        assert state_of(store, borrower) == JobState.RUNNING
        assert state_of(store, waiting) == JobState.QUEUED
        time.sleep(0.2)
    assert store.find(borrower).preemptions == 1
    assert lcm.halts == [(borrower, 1)]


def test_a_higher_priority_job_halts_a_lower_priority_one_of_its_own_team(trainer):
    service, store, lcm = trainer
    service.set_quota("c", Quota(cpus=4), "admin")  # no cohort: nothing to borrow
    low = submit(service, "c")  # all of c's 4 CPUs
    running(service, store, low)
    body = {"name": "urgent", "command": "x", "learners": 1, "priority": "high", "resources": {"cpus": 2}}
    high = service.submit("c", json.dumps(body)).id
    wait_for(lambda: state_of(store, low) == JobState.HALTING, 10, "the low-priority job to be halted")
    assert store.find(low).reason.startswith(f"preempted: halted for a higher-priority job ({high} of team c)")
    wait_for(lambda: (low, 1) in lcm.halts, 10, "the LCM's halt request")
    halted(service, store, low, 1, 5)
    running(service, store, high)
    wait_for(lambda: state_of(store, low) == JobState.QUEUED, 10, "the low-priority job to be requeued")

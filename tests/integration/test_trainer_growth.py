"""Elastic growth through the real dispatcher and job store: granted only when no queued job waits,
counted by admission, sent to the LCM, charged in the usage totals, cleared for the next attempt."""

from __future__ import annotations

import time

import pytest

from tests.fakes.lcm import IdleLcm
from tests.servers import wait_for
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.common.states import JobState
from trainforge_services.trainer.accounting import reports
from trainforge_services.trainer.resources import Usage
from trainforge_services.trainer.store import JobStore
from trainforge_services.trainer.wiring import wire

pytestmark = pytest.mark.integration
GI = 2**30
ONE = {"cpus": 1, "memory": "1Gi", "gpus": 1}


@pytest.fixture
def store(mongo_db, unique) -> JobStore:
    s = JobStore(mongo_db, collection=f"jobs_{unique}")
    s.ensure_indexes()
    return s


def submit(store: JobStore, job_id: str, learners: object, team: str = "team-a") -> None:
    manifest = parse_manifest({"name": job_id, "framework": "torch", "command": "python train.py",
                               "learners": learners, "resources": ONE})
    store.insert(job_id, team, manifest)
    store.transition(job_id, JobState.QUEUED, "admitted", "trainer")


def test_growth_waits_for_the_queue_and_admission_counts_what_was_granted(store):
    lcm = IdleLcm(Usage(gpus=4, cpus=16, memory=64 * GI, learners=8))
    core = wire(store, lcm, interval=60)
    dispatcher = core.dispatcher
    try:
        submit(store, "el", {"min": 1, "max": 4})
        submit(store, "big", 4, team="team-b")  # needs the whole backend: waits behind the elastic job
        assert dispatcher.run_once().dispatch == ["el"]
        store.transition("el", JobState.RUNNING, "1 of 1 learners running", "monitor")

        dispatcher.run_once()
        assert store.find("el").grown == Usage(), "grown while a job waits for the room"
        assert store.find("big").reason == "needs 4 GPUs; capacity 4, in use 1"

        store.transition("big", JobState.CANCELLED, "cancelled", "user")
        dispatcher.run_once()  # the queue is empty: the elastic job is granted what is free
        el = store.find("el")
        assert (el.grown, el.holds.learners) == (Usage(3, 3.0, 3 * GI, 3), 4)
        wait_for(lambda: lcm.grants == [("el", 1, 4)], 10, "the grant to reach the LCM")
        dispatcher.run_once()
        assert lcm.grants == [("el", 1, 4)], "a grant the LCM acknowledged is not sent again"

        submit(store, "late", 1, team="team-b")
        assert dispatcher.run_once().dispatch == []
        assert store.find("late").reason == "needs 1 GPU; capacity 4, in use 4", "the grant is not counted"

        [team_a] = [r for r in reports(store.usage_rows(), {}, time.time()) if r.team == "team-a"]
        assert team_a.held.usage.gpus == 4 and team_a.gpu_seconds > 0

        # the attempt ends: its seconds are charged, and the next attempt starts from its minimum
        done = store.transition("el", JobState.RESTARTING, "learner 0 failed", "monitor")
        done = store.transition("el", JobState.QUEUED, "restart 1", "trainer", attempt=done.attempt)
        assert done.gpu_seconds >= team_a.gpu_seconds and done.grown_since is None
        store.cleanup_done("el", done.attempt)
        store.transition("late", JobState.CANCELLED, "cancelled", "user")
        assert dispatcher.run_once().dispatch == ["el"]
        assert store.find("el").grown == Usage()
    finally:
        core.stop()


def test_a_stale_grant_is_refused_by_the_store(store):
    submit(store, "el", {"min": 1, "max": 4})
    for to in (JobState.DEPLOYING, JobState.RUNNING):
        store.transition("el", to, "test", "trainer")
    assert store.grant("el", 1, Usage(), Usage(1, 1.0, GI, 1))
    assert not store.grant("el", 1, Usage(), Usage(2, 2.0, 2 * GI, 2)), "granted over a grant it did not see"
    assert not store.grant("el", 2, Usage(1, 1.0, GI, 1), Usage(2, 2.0, 2 * GI, 2)), "granted another attempt"
    assert store.find("el").grown == Usage(1, 1.0, GI, 1)


def test_per_day_usage_charges_what_the_job_held_before_and_after_its_grant(store):
    """The grant's history entry, as the store writes it, through the wire shape to per-day usage."""
    from trainforge_services.api import usage
    from trainforge_services.api.trainer_client import job_to_json
    from trainforge_services.trainer.grpc_api import job_to_proto

    submit(store, "el", {"min": 1, "max": 3})
    for to in (JobState.DEPLOYING, JobState.RUNNING):
        store.transition("el", to, "test", "trainer")
    assert store.grant("el", 1, Usage(), Usage(2, 2.0, 2 * GI, 2))
    job = store.find("el")
    [entry] = [e for e in job.history if e.grown is not None]
    assert (entry.from_state, entry.to_state, entry.grown) == (JobState.RUNNING, JobState.RUNNING,
                                                                Usage(2, 2.0, 2 * GI, 2))
    reserved = next(e.ts for e in job.history if e.to_state == JobState.DEPLOYING)
    rest = job_to_json(job_to_proto(job))
    now = entry.ts + 100.0
    [row] = [r for r in usage.rows([rest], reserved - 1, now + 1, now) if r.team == "team-a"]
    # 1 learner (1 GPU, 1 CPU, 1 GiB) from the reservation to the grant, 3 after it
    before, after = entry.ts - reserved, 100.0
    assert row.gpu_seconds == pytest.approx(before + 3 * after, abs=0.01)
    assert row.cpu_seconds == pytest.approx(before + 3 * after, abs=0.01)
    assert row.memory_gib_seconds == pytest.approx(before + 3 * after, abs=0.01)


def test_a_deposed_leaders_grant_is_refused_while_the_new_leaders_succeeds(store, mongo_db, unique):
    from trainforge_services.trainer.fence import Deposed, Fence

    submit(store, "el", {"min": 1, "max": 4})
    fence = Fence(mongo_db, "dispatcher", f"fences_{unique}")
    assert fence.take(5, "old")
    assert store.apply_transition("el", JobState.DEPLOYING, "reserved", "trainer", fence=5).changed
    store.transition("el", JobState.RUNNING, "running", "monitor")
    assert store.grant("el", 1, Usage(), Usage(1, 1.0, GI, 1), fence=5)

    # a newer leader takes the fence: its stamp reaches the running elastic job
    assert fence.take(9, "new")
    assert store.stamp_fence(9) == 1
    with pytest.raises(Deposed, match="older than the job's fence 9"):
        store.grant("el", 1, Usage(1, 1.0, GI, 1), Usage(2, 2.0, 2 * GI, 2), fence=5)
    assert store.find("el").grown == Usage(1, 1.0, GI, 1)
    assert store.grant("el", 1, Usage(1, 1.0, GI, 1), Usage(3, 3.0, 3 * GI, 3), fence=9)
    job = store.find("el")
    assert (job.grown, job.fence) == (Usage(3, 3.0, 3 * GI, 3), 9)
    assert [e.grown.learners for e in job.history if e.grown is not None] == [1, 3]

"""Leader election in real etcd and the dispatcher's fence in the real MongoDB-wire server."""

from __future__ import annotations

import threading
import time

import pytest

from tests.fakes.lcm import IdleLcm
from tests.servers import wait_for
from trainforge_services.common.election import Election
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.common.states import JobState
from trainforge_services.trainer.fence import Deposed, Fence, FenceGate
from trainforge_services.trainer.resources import Usage
from trainforge_services.trainer.store import JobStore
from trainforge_services.trainer.wiring import wire

pytestmark = pytest.mark.integration
GI = 2**30
MANIFEST = '{"name": "fenced", "command": "python train.py", "resources": {"cpus": 1, "memory": "1Gi"}}'


@pytest.fixture
def queued(mongo_db, unique) -> tuple[JobStore, str]:
    store = JobStore(mongo_db, f"jobs_{unique}")
    store.ensure_indexes()
    store.insert("job-1", "team-a", parse_manifest(MANIFEST))
    assert store.transition("job-1", JobState.QUEUED, "admitted", "trainer") is not None
    return store, "job-1"


def test_a_deposed_leaders_reservation_is_refused_by_the_store(mongo_db, unique, queued):
    store, job = queued
    fence = Fence(mongo_db, "dispatcher", f"fences_{unique}")
    old, new = FenceGate(fence), FenceGate(fence)
    assert fence.take(5, "old")
    old.lead(5)
    assert old.confirm() == 5

    # a newer leader takes the fence and stamps the queue; the old one still thinks it leads
    assert fence.take(9, "new")
    assert store.stamp_fence(9) == 1
    new.lead(9)
    assert not fence.take(7, "late"), "a term older than the store's must not be taken"
    assert fence.current() == 9

    with pytest.raises(Deposed, match="superseded by term 9"):
        old.confirm()
    assert not old.leading
    with pytest.raises(Deposed, match="older than the job's fence 9"):
        store.apply_transition(job, JobState.DEPLOYING, "stale reservation", "trainer", fence=5)
    assert store.find(job).state == JobState.QUEUED

    done = store.apply_transition(job, JobState.DEPLOYING, "reserved", "trainer", fence=new.confirm())
    assert done.changed and done.job.state == JobState.DEPLOYING


def test_a_deposed_dispatchers_pass_reserves_nothing(mongo_db, unique, queued):
    store, job = queued
    fence = Fence(mongo_db, "dispatcher", f"fences_{unique}")
    stale = FenceGate(fence)
    assert fence.take(3, "stale")
    stale.lead(3)
    assert fence.take(4, "newer")  # and the newer leader has not stamped yet: the pass's own check refuses
    lcm = IdleLcm(Usage(gpus=0, cpus=8, memory=64 * GI))
    core = wire(store, lcm, gate=stale, interval=60)
    dispatcher = core.dispatcher
    try:
        with pytest.raises(Deposed):
            dispatcher.run_once()
    finally:
        core.stop()
    assert store.find(job).state == JobState.QUEUED
    assert len(store.find(job).history) == 2


def test_a_follower_is_elected_within_a_lease_ttl_of_the_leaders_death(coordinator):
    events: list[tuple[str, str, int]] = []
    lock = threading.Lock()

    def replica(name: str) -> Election:
        def elected(term: int) -> None:
            with lock:
                events.append(("elected", name, term))

        def deposed() -> None:
            with lock:
                events.append(("deposed", name, 0))

        return Election(coordinator, "trainer", ttl=2, identity=name, on_elected=elected, on_deposed=deposed)

    first, second = replica("a").start(), replica("b").start()
    try:
        leader = wait_for(lambda: first if first.leading else second if second.leading else None, 10,
                          "a leader")
        follower = second if leader is first else first
        # the key decides who leads: it names the leader, and the other replica does not think it leads
        holder, _ = coordinator.get(coordinator.keys.leader("trainer"))
        assert holder == {"holder": leader.identity} and not follower.leading, "two replicas lead at once"
        first_term = leader.term
        # dying without resigning: its key stays until its lease runs out
        leader.stop(resign=False)
        died = time.monotonic()
        wait_for(lambda: follower.leading, 10, "the follower to take over")
        took = time.monotonic() - died
        assert took < 2 * 2 + 1, f"takeover took {took:.1f}s with a 2s lease"
        assert follower.term > first_term
        value, _ = coordinator.get(coordinator.keys.leader("trainer"))
        assert value == {"holder": follower.identity}
    finally:
        first.stop()
        second.stop()
    assert [e[0] for e in events if e[1] == follower.identity][0] == "elected"

"""The LCM leader's fence in real etcd: a deposed leader's writes are refused and it stops acting.

Two LCM replicas (`LeaderLifecycle`, in-process, one state directory as in
a deployment) on the local backend with the fake interpreter. The leader's
election key is deleted behind its back, the way its lease runs out while it
is paused: its election thread has not noticed, so it still believes it
leads, while the other replica is elected and adopts the running job. The
stale leader's next write is refused by etcd, it answers as a follower, and
gives up leading; the new leader acts.
"""
from __future__ import annotations

import pytest

from tests.integration.lcm_local.conftest import deployment
from tests.servers import wait_for
from trainforge_services.common.adapters.etcd import Coordinator, FenceRefused
from trainforge_services.common.contracts.etcd import AttemptInfo, HaltRequest
from trainforge_services.common.election import FOLLOWING
from trainforge_services.common.errors import Conflict, Unavailable
from trainforge_services.lcm.backends.local import LocalBackend
from trainforge_services.lcm.lifecycle import LifecycleManager
from trainforge_services.lcm.replicas import LeaderLifecycle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_every_write_of_a_fenced_connection_is_refused_once_its_election_key_is_taken_over(coordinator, unique):
    key, job = coordinator.keys.leader(f"lcm-{unique}"), f"f-{unique}"
    old_lease = coordinator.grant_lease(5)
    assert coordinator.create(key, {"holder": "old"}, lease=old_lease)
    refused: list[str] = []
    stale = coordinator.fenced(key, coordinator.get(key)[1], lambda: refused.append("old"))
    stale.put(coordinator.keys.attempt(job), AttemptInfo(attempt=1, learners=1).value())
    assert stale.create(coordinator.keys.halt(job), HaltRequest(attempt=1).value())
    assert not stale.create(coordinator.keys.halt(job), HaltRequest(attempt=2).value()), "the key exists"
    stale.confirm()

    old_lease.revoke()  # its lease ran out while it was paused; another replica is elected
    assert coordinator.create(key, {"holder": "new"}, lease=coordinator.grant_lease(5))
    new = coordinator.fenced(key, coordinator.get(key)[1])
    new.put(coordinator.keys.attempt(job), AttemptInfo(attempt=2, learners=1).value())

    attempt_key, halt_key = coordinator.keys.attempt(job), coordinator.keys.halt(job)
    writes = {
        "put": lambda: stale.put(attempt_key, AttemptInfo(attempt=1, learners=1).value()),
        "create": lambda: stale.create(coordinator.keys.learner_status(job, 0), {"state": 1}),
        "replace": lambda: stale.replace(attempt_key, coordinator.get(attempt_key)[1], {"attempt": 1}),
        "delete": lambda: stale.delete(halt_key),
        "delete_prefix": lambda: stale.delete_prefix(coordinator.keys.job(job)),
        "delete_prefix and mark killed": lambda: stale.delete_prefix(
            coordinator.keys.job(job), put=(coordinator.keys.killed(job), {"attempt": 2}),
            lease=coordinator.grant_lease(60)),
        "confirm": stale.confirm,
    }
    for name, write in writes.items():
        with pytest.raises(FenceRefused, match="was taken over"):
            write()
        assert refused == ["old"], f"{name}: the deposed writer must be told once, not {refused}"
    assert AttemptInfo.model_validate(coordinator.get(attempt_key)[0]).attempt == 2
    assert coordinator.get(halt_key)[0] is not None
    assert coordinator.get(coordinator.keys.learner_status(job, 0))[0] is None
    assert coordinator.get(coordinator.keys.killed(job))[0] is None, "a deposed leader marked an attempt killed"
    new.delete_prefix(coordinator.keys.job(job))  # the leader's own writes go through
    assert coordinator.list(coordinator.keys.job(job))[0] == {}


def test_a_stale_lcm_leader_writes_nothing_and_the_new_leader_takes_over(lcm_settings, etcd_server, fake, unique):
    settings = lcm_settings()
    built: list[LifecycleManager] = []

    def replica(name: str) -> LeaderLifecycle:
        def build(fenced: Coordinator) -> LifecycleManager:
            # no supervision pass in this test's time: the refusal shown is the halt's own write
            built.append(LifecycleManager.from_settings(settings, LocalBackend(settings, kill_grace=5), fenced,
                                                 start_timeout=30, supervise_interval=600))
            return built[-1]

        return LeaderLifecycle(build, Coordinator(settings.etcd_endpoints, settings.etcd_prefix), backend="local",
                               ttl=2, address=name).start()

    a, b = replica("127.0.0.1:1"), replica("127.0.0.1:2")
    coordinator = Coordinator(settings.etcd_endpoints, settings.etcd_prefix)
    job = f"j-{unique}"
    try:
        def serving() -> LeaderLifecycle | None:
            for r in (a, b):
                try:
                    r.capacity()
                    return r
                except Unavailable:
                    pass
            return None

        old = wait_for(serving, 20, "an LCM replica to lead")
        new = b if old is a else a
        old.deploy(deployment(job, learners=1))
        fake.wait_runs(2)

        # the lease runs out while the leader is paused: its key goes and the other replica is elected
        coordinator.delete(coordinator.keys.leader("lcm"))
        wait_for(lambda: [j.job_id for j in new.running_jobs()] == [job], 20, "the new leader to adopt the job")
        assert old.election.leading, "the stale leader has not noticed yet: that is the case fenced against"

        with pytest.raises(Unavailable, match=FOLLOWING):
            old.halt(job, 1)
        assert coordinator.get(coordinator.keys.halt(job))[0] is None, "a deposed leader's halt was written"
        wait_for(lambda: not old.election.leading, 10, "the stale leader to give up leading")
        with pytest.raises(Unavailable, match=FOLLOWING):
            old.kill(job)
        assert [j.job_id for j in new.running_jobs()] == [job], "the stale leader stopped the job"

        new.halt(job, 1)
        assert HaltRequest.model_validate(coordinator.get(coordinator.keys.halt(job))[0]).attempt == 1
        assert new.kill(job) == 2
        # the deploy the old leader served, resent to the new one after the KillJob, starts nothing
        runs = len(fake.runs())
        with pytest.raises(Conflict, match=f"job {job} attempt 1 was killed; a new run needs attempt 2"):
            new.deploy(deployment(job, learners=1))
        assert len(fake.runs()) == runs and new.running_jobs() == []
    finally:
        for r in (a, b):
            r.close()
        coordinator.close()
        for lifecycle in built:  # the processes the stale leader started, which the new one stopped, are reaped
            lifecycle.backend.close()

"""Halt, resume and restart-after-failure as the Trainer decides them (docs/CONTRACTS.md).

A real job store (the MongoDB-wire server) and dispatcher; the LCM is a
scripted stand-in that records what it is asked, and the job monitor's
reports are made directly, so each rule is checked on its own.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.integration.test_trainer_dispatcher import ScriptedLcm
from tests.servers import wait_for
from trainforge_services.common.errors import Conflict
from trainforge_services.common.states import JobState, LearnerState
from trainforge_services.trainer.job_service import JobService
from trainforge_services.trainer.quotas import QuotaStore
from trainforge_services.trainer.record import LearnerReport
from trainforge_services.trainer.resources import BackendSize, Quota, Usage
from trainforge_services.trainer.store import JobStore
from trainforge_services.trainer.storerefs import Publications, StoreOwners, StoreRefs
from trainforge_services.trainer.wiring import wire

GI = 2**30
TEAM = "vision"


def refs_for(db, unique: str) -> StoreRefs:
    """The store-reference rule over the collections a test named with `unique`."""
    return StoreRefs(StoreOwners(db, jobs=f"jobs_{unique}", experiments=f"experiments_{unique}",
                                 workflows=f"workflows_{unique}"), Publications(db, f"publications_{unique}"))


@pytest.fixture
def trainer(mongo_db, unique):
    store = JobStore(mongo_db, collection=f"jobs_{unique}")
    store.ensure_indexes()
    lcm = ScriptedLcm(BackendSize(Usage(cpus=8, memory=32 * GI, learners=8)))
    core = wire(store, lcm, quotas=QuotaStore(mongo_db, f"quotas_{unique}"), interval=0.2,
                spacing=0.0, kill_backoff=0.01)
    dispatcher = core.dispatcher
    service = JobService(store, core.lifecycle, core.calls, dispatcher, QuotaStore(mongo_db, f"quotas_{unique}"), refs_for(mongo_db, unique))
    dispatcher.start()
    yield service, store, lcm
    core.stop()


def submit(service: JobService, **manifest) -> str:
    body = {"name": "train", "command": "python train.py", "learners": 2, **manifest}
    return service.submit(TEAM, json.dumps(body)).id


def state_of(store: JobStore, job_id: str) -> JobState:
    return JobState(store.find(job_id).state)


def running(service: JobService, store: JobStore, job_id: str, attempt: int = 1) -> None:
    wait_for(lambda: store.find(job_id).attempt == attempt and state_of(store, job_id) == JobState.DEPLOYING,
             10, f"attempt {attempt} to deploy")
    service.report(job_id, attempt, JobState.RUNNING, "all 2 learners started", "monitor")
    assert state_of(store, job_id) == JobState.RUNNING


def test_halt_checkpoints_frees_the_job_and_resume_continues_from_the_checkpoint(trainer):
    service, store, lcm = trainer
    job = submit(service)
    running(service, store, job)

    halting = service.halt(TEAM, job, "user:k1")
    assert JobState(halting.state) == JobState.HALTING
    assert "halt requested by user:k1" in halting.reason
    wait_for(lambda: lcm.halts == [(job, 1)], 10, "the LCM's halt request")
    assert JobState(service.halt(TEAM, job, "user:k1").state) == JobState.HALTING  # again: a no-op

    halted = service.report(job, 1, JobState.HALTED, "all 2 learners halted at step 120", "monitor",
                            checkpoint_step=120)
    assert (JobState(halted.state), halted.checkpoint_step) == (JobState.HALTED, 120)
    wait_for(lambda: not store.find(job).cleanup_pending, 10, "the learners to be removed")
    assert lcm.kill_tries == [job]
    assert lcm.kill_attempts == [(job, 1)]  # the KillJob names the halted attempt
    assert service.team_usage(TEAM).active_jobs == 0  # nothing held while halted

    resumed = service.resume(TEAM, job, "user:k1")
    assert (JobState(resumed.state), resumed.attempt) == (JobState.QUEUED, 2)
    assert "continues from its checkpoint at step 120" in resumed.reason
    assert service.resume(TEAM, job, "user:k1").attempt == 2  # a retried resume changes nothing
    running(service, store, job, attempt=2)
    # DEPLOYING is stored before the dispatcher's deploy call reaches the stand-in LCM
    wait_for(lambda: (job, 2) in lcm.checkpoint_uris, 10, "the deploy to reach the LCM")
    assert lcm.checkpoint_uris[(job, 2)] == f"store://jobs/{job}/checkpoints/"
    assert lcm.checkpoint_uris[(job, 1)] == ""
    # a late report of the halted attempt is ignored
    assert JobState(service.report(job, 1, JobState.FAILED, "late", "monitor").state) == JobState.RUNNING
    path = [(JobState(e.from_state).name, JobState(e.to_state).name) for e in store.find(job).history]
    assert path[-5:] == [("RUNNING", "HALTING"), ("HALTING", "HALTED"), ("HALTED", "QUEUED"),
                         ("QUEUED", "DEPLOYING"), ("DEPLOYING", "RUNNING")]


def test_a_job_resumed_before_its_cleanup_has_the_halted_attempt_killed_not_the_next(trainer):
    """Resumed while KillJob still fails, the job is QUEUED as attempt 2: the retried KillJob names attempt 1
    (the one that ran), so the LCM marks only that killed and attempt 2 deploys."""
    service, store, lcm = trainer
    lcm.kill_failures = 10**6
    job = submit(service)
    running(service, store, job)
    service.halt(TEAM, job, "user:k1")
    service.report(job, 1, JobState.HALTED, "all 2 learners halted at step 7", "monitor", checkpoint_step=7)
    wait_for(lambda: len(lcm.kill_tries) >= 1, 10, "a KillJob to fail")
    resumed = service.resume(TEAM, job, "user:k1")
    assert (JobState(resumed.state), resumed.attempt, resumed.cleanup_pending) == (JobState.QUEUED, 2, True)
    lcm.kill_failures = 0
    running(service, store, job, attempt=2)
    wait_for(lambda: (job, 2) in lcm.deploys, 10, "the deploy to reach the LCM")
    assert lcm.kill_attempts and set(lcm.kill_attempts) == {(job, 1)}


def test_what_cannot_be_halted_or_resumed_says_why(trainer):
    service, store, lcm = trainer
    job = submit(service, resources={"cpus": 4})  # 2 x 4 CPUs: all the backend has
    waiting = submit(service)
    wait_for(lambda: "in use 8" in store.find(waiting).reason, 10, "the second job to wait")
    with pytest.raises(Conflict, match="waiting in the queue"):
        service.halt(TEAM, waiting, "user")
    with pytest.raises(Conflict, match="only a halted job can be resumed"):
        service.resume(TEAM, job, "user")
    running(service, store, job)
    service.report(job, 1, JobState.STORING, "exited 0", "monitor")
    with pytest.raises(Conflict, match="already storing"):
        service.halt(TEAM, job, "user")


def test_a_failure_while_halting_keeps_what_was_stored(trainer):
    service, store, lcm = trainer
    job = submit(service, restart={"max_restarts": 3, "backoff": "1s"})
    running(service, store, job)
    service.halt(TEAM, job, "user")
    doc = service.report(job, 1, JobState.FAILED, "learner 1 lost: its controller stopped renewing its lease",
                         "monitor")
    assert JobState(doc.state) == JobState.HALTED
    assert "learner 1 lost" in doc.reason and "last stored checkpoint" in doc.reason
    assert doc.restarts == 0


def test_a_job_that_finishes_before_its_halt_reaches_the_learners_completes(trainer):
    # the learners exited 0 just as the halt was asked for: the monitor reports STORING and COMPLETED
    service, store, lcm = trainer
    job = submit(service)
    running(service, store, job)
    service.halt(TEAM, job, "user:k1")
    storing = service.report(job, 1, JobState.STORING, "all 2 learners exited 0; 2 storing outputs", "monitor")
    assert JobState(storing.state) == JobState.STORING
    assert "finished before the halt reached them" in storing.reason
    done = service.report(job, 1, JobState.COMPLETED, "all 2 learners completed; outputs stored", "monitor")
    assert JobState(done.state) == JobState.COMPLETED
    wait_for(lambda: not store.find(job).cleanup_pending, 10, "the learners to be removed")
    assert service.team_usage(TEAM).active_jobs == 0  # the quota is free, not held by a job stuck halting
    path = [(JobState(e.from_state).name, JobState(e.to_state).name) for e in store.find(job).history]
    assert path[-3:] == [("RUNNING", "HALTING"), ("HALTING", "STORING"), ("STORING", "COMPLETED")]


def test_a_failed_attempt_restarts_with_growing_backoff_then_fails(trainer):
    service, store, lcm = trainer
    job = submit(service, restart={"max_restarts": 2, "backoff": "0.3s"})
    running(service, store, job)

    doc = service.report(job, 1, JobState.FAILED, "learner 1 exited with code -9", "monitor")
    assert JobState(doc.state) == JobState.RESTARTING
    assert doc.reason.startswith("restart 1 of 2 in 0.3s after: learner 1 exited with code -9")
    wait_for(lambda: state_of(store, job) == JobState.QUEUED, 10, "the next attempt to be queued")
    queued = store.find(job)
    assert (queued.attempt, queued.restarts) == (2, 1)
    assert queued.not_before > queued.history[-1].ts
    assert lcm.kill_tries == [job]  # the failed attempt was removed before the next was queued
    assert lcm.kill_attempts == [(job, 1)]
    running(service, store, job, attempt=2)
    # DEPLOYING is stored before the dispatcher's deploy call reaches the stand-in LCM
    wait_for(lambda: (job, 2) in lcm.checkpoint_uris, 10, "the deploy to reach the LCM")
    assert lcm.checkpoint_uris[(job, 2)] == f"store://jobs/{job}/checkpoints/"

    doc = service.report(job, 2, JobState.FAILED, "learner 0 lost", "monitor")
    assert doc.reason.startswith("restart 2 of 2 in 0.6s after: learner 0 lost")
    running(service, store, job, attempt=3)

    doc = service.report(job, 3, JobState.FAILED, "learner 0 exited with code 1", "monitor")
    assert JobState(doc.state) == JobState.FAILED
    assert "no restarts left: 2 of 2 used" in doc.reason
    assert doc.restarts == 2
    terminal = [e for e in store.find(job).history if JobState(e.to_state) == JobState.FAILED]
    assert len(terminal) == 1


def test_a_job_stopped_by_its_timeout_fails_without_a_restart(trainer):
    service, store, lcm = trainer
    job = submit(service, restart={"max_restarts": 2, "backoff": "0.1s"}, timeout="1s")
    running(service, store, job)
    reason = "learner 0: ran longer than 1s (the manifest's timeout); exited with code -15"
    learners = {"0": LearnerReport(rank=0, state=int(LearnerState.LEARNER_FAILED), exit_code=-15, attempt=1,
                                   message=reason, timed_out=True),
                "1": LearnerReport(rank=1, state=int(LearnerState.LEARNER_FAILED), exit_code=-15, attempt=1)}
    doc = service.report(job, 1, JobState.FAILED, reason, "monitor", learners=learners)
    assert JobState(doc.state) == JobState.FAILED and doc.restarts == 0
    assert doc.reason == reason and doc.learners["0"].timed_out
    assert [JobState(e.to_state) for e in store.find(job).history].count(JobState.RESTARTING) == 0


def test_a_requeued_restart_is_killed_once_and_not_held_back_for_a_cleanup(trainer):
    service, store, lcm = trainer
    job = submit(service, restart={"max_restarts": 1, "backoff": "30s"})
    running(service, store, job)
    service.report(job, 1, JobState.FAILED, "learner 0 lost", "monitor")
    wait_for(lambda: "waiting out the backoff" in store.find(job).reason, 10, "the backoff reason")
    assert not store.find(job).cleanup_pending
    time.sleep(1.5)  # past the dispatcher's once-a-second scan of pending cleanups
    doc = store.find(job)
    assert (JobState(doc.state), doc.attempt, bool(doc.cleanup_pending)) == (JobState.QUEUED, 2, False)
    assert "waiting out the backoff" in doc.reason
    assert lcm.kill_tries == [job]


def test_the_backoff_holds_the_job_back_with_a_reason(trainer):
    service, store, lcm = trainer
    job = submit(service, restart={"max_restarts": 1, "backoff": "30s"})
    running(service, store, job)
    service.report(job, 1, JobState.FAILED, "learner 0 lost", "monitor")
    wait_for(lambda: "waiting out the backoff" in store.find(job).reason, 10, "the backoff reason")
    doc = store.find(job)
    assert (JobState(doc.state), doc.attempt) == (JobState.QUEUED, 2)
    assert (job, 2) not in lcm.deploys
    assert JobState(service.cancel(TEAM, job, "user").state) == JobState.CANCELLED


def test_the_cluster_view_has_the_lcm_s_capacity_and_what_active_jobs_hold(trainer):
    service, store, lcm = trainer
    wait_for(lambda: service.cluster().capacity is not None, 10, "the LCM's capacity to be known")
    job = submit(service, resources={"cpus": 1.5, "memory": "1Gi"})
    submit(service, learners=8)  # cannot fit beside the first: stays queued
    running(service, store, job)
    view = service.cluster()
    assert view.capacity.total == Usage(cpus=8, memory=32 * GI, learners=8) and view.unknown_reason == ""
    assert view.held == Usage(gpus=0, cpus=3.0, memory=2 * GI, learners=2)
    assert (view.active_jobs, view.queued_jobs) == (1, 1)

    from trainforge_services.api.trainer_client import cluster_to_json
    from trainforge_services.trainer.grpc_api import cluster_to_proto

    wire = cluster_to_json(cluster_to_proto(view))
    assert wire["known"] and wire["capacity"] == {"gpus": 0, "cpus": 8.0, "memory": 32 * GI, "learners": 8}
    assert wire["free"] == {"gpus": 0, "cpus": 5.0, "memory": 30 * GI, "learners": 6}


def test_a_quota_an_admin_sets_is_sent_to_the_lcm(trainer):
    service, store, lcm = trainer
    service.set_quota(TEAM, Quota(gpus=2, jobs=1), "admin")
    wait_for(lambda: lcm.synced, 10, "the LCM to be told")
    assert lcm.synced == [(TEAM, Quota(gpus=2, jobs=1))]


class LateLcm(ScriptedLcm):
    """An LCM that serves a job's first deploy only once let go, and then as the LCM does once that attempt
    was killed meanwhile: a Conflict (services/lcm/lifecycle/core.py)."""

    def __init__(self, capacity: BackendSize, job_id: str):
        super().__init__(capacity)
        self.job_id, self.arrived, self.go, self.answered = job_id, threading.Event(), threading.Event(), \
            threading.Event()

    def deploy_job(self, job_id, team, attempt, manifest_json, code_uri, checkpoint_uri="", gated=False,  # noqa: ANN001
                   reads=()):
        if (job_id, attempt) == (self.job_id, 1):
            self.arrived.set()
            try:
                assert self.go.wait(20), "the test never let the deploy go"
                raise Conflict(f"job {job_id} attempt 1 was killed; a new run needs attempt 2")
            finally:
                self.answered.set()
        return super().deploy_job(job_id, team, attempt, manifest_json, code_uri, checkpoint_uri, gated)


@pytest.mark.parametrize("then", ["cancelled", "restarted"])
def test_a_deploy_the_lcm_refuses_because_its_attempt_was_killed_loses_nothing(mongo_db, unique, then):
    """The deploy of attempt 1 reaches the LCM after the job moved on and its KillJob ran: a cancelled job stays
    cancelled; a restarted one runs as attempt 2."""
    store = JobStore(mongo_db, collection=f"jobs_{unique}")
    store.ensure_indexes()
    job = f"late-{unique}"
    lcm = LateLcm(BackendSize(Usage(cpus=8, memory=32 * GI, learners=8)), job)
    quotas = QuotaStore(mongo_db, f"quotas_{unique}")
    core = wire(store, lcm, quotas=quotas, interval=0.2, spacing=0.0, kill_backoff=0.01)
    dispatcher = core.dispatcher
    service = JobService(store, core.lifecycle, core.calls, dispatcher, quotas, refs_for(mongo_db, unique))
    dispatcher.start()
    try:
        body = {"name": "train", "command": "python train.py", "learners": 2,
                "restart": {"max_restarts": 1, "backoff": "0.1s"}}
        service.submit(TEAM, json.dumps(body), job_id=job)
        assert lcm.arrived.wait(10), "attempt 1 was never deployed"
        if then == "cancelled":
            service.cancel(TEAM, job, "user:k1")
        else:  # its learners failed before the deploy's answer came back: restarted as attempt 2
            service.report(job, 1, JobState.FAILED, "learner 0 exited with code 1", "monitor")
        wait_for(lambda: lcm.kill_tries == [job], 10, "the KillJob")
        assert lcm.kill_attempts == [(job, 1)]  # the attempt whose deploy the LCM refuses when it arrives
        if then == "restarted":
            wait_for(lambda: lcm.deploys == [(job, 2)], 10, "attempt 2 to deploy")
        else:
            wait_for(lambda: not store.find(job).cleanup_pending, 10, "the cleanup")
        lcm.go.set()
        assert lcm.answered.wait(10), "the deploy of attempt 1 was not answered"
        core.stop()  # waits for its calls: what the dispatcher made of the Conflict is done
        if then == "cancelled":
            doc = store.find(job)
            assert (JobState(doc.state), doc.reason) == (JobState.CANCELLED, "cancelled by user:k1")
        else:
            doc = store.find(job)
            assert (JobState(doc.state), doc.attempt) == (JobState.DEPLOYING, 2), doc.reason
            assert lcm.deploys == [(job, 2)]
        assert not any("deploy failed" in e.reason for e in store.find(job).history), "the Conflict failed the job"
    finally:
        core.stop()

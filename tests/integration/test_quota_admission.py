"""Team quotas, fair turns, usage and idempotent submits, through the Trainer's gRPC face.

Real MongoDB-wire server, the in-process fake LCM of test_trainer_service.
The dispatch interval is long, so every dispatch seen here comes from a
wake-up (a submit, a job ending, a quota change).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.integration.test_trainer_service import FakeLcm, trainer_settings
from tests.servers import wait_for
from trainforge_protos import common_pb2, lcm_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import rpc, rpcauth
from trainforge_services.common.errors import Conflict, InvalidArgument
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.common.states import JobState
from trainforge_services.trainer.store import JobStore
from trainforge_services.trainer.wiring import serve

GI = 2**30


@contextlib.contextmanager
def running_fake_lcm(**capacity) -> Iterator[FakeLcm]:
    """The fake LCM of test_trainer_service serving on a free port; 8 GPUs, 16 CPUs unless told."""
    lcm = FakeLcm(**{"gpus": 8, "cpus": 16, "memory": 64 * GI, "max_learners": 16, **capacity})
    server, port = rpc.make_server("127.0.0.1:0")
    lcm_pb2_grpc.add_LifecycleManagerServicer_to_server(lcm, server)
    server.start()
    lcm.address = f"127.0.0.1:{port}"
    try:
        yield lcm
    finally:
        server.stop(0).wait()


@contextlib.contextmanager
def running_trainer(mongo_server, unique: str, tmp_path, lcm: FakeLcm) -> Iterator[Teams]:  # noqa: ANN001
    """A Trainer with collections of its own, and a client for it."""
    settings = trainer_settings(mongo_server, unique, tmp_path, lcm.address)
    trainer = serve(settings, collection=f"jobs_{unique}", quota_collection=f"quotas_{unique}")
    channel = rpc.channel(trainer.address, authorization=rpcauth.service_authorization(settings))
    try:
        yield Teams(trainer_pb2_grpc.TrainerStub(channel))
    finally:
        channel.close()
        trainer.stop(grace=0)


@pytest.fixture
def fake_lcm(request):
    """`@pytest.mark.parametrize("fake_lcm", [{...}], indirect=True)` sets its capacity."""
    with running_fake_lcm(**getattr(request, "param", {})) as lcm:
        yield lcm


@pytest.fixture
def tf(mongo_server, unique, tmp_path, fake_lcm):
    with running_trainer(mongo_server, unique, tmp_path, fake_lcm) as client:
        yield client


def manifest(name: str, *, gpus: int = 0, cpus: float = 1, memory: str = "1Gi", learners: int = 1,
             gpu_type: str | None = None, priority: str = "normal") -> str:
    resources: dict = {"gpus": gpus, "cpus": cpus, "memory": memory}
    if gpu_type:
        resources["gpu_type"] = gpu_type
    return json.dumps({"name": name, "command": "python train.py", "learners": learners,
                       "resources": resources, "priority": priority})


class Teams:
    """The Trainer's RPCs as an admin and several teams would call them."""

    def __init__(self, stub: trainer_pb2_grpc.TrainerStub):
        self.stub = stub

    def submit(self, team: str, job_id: str = "", key: str = "", **resources) -> common_pb2.Job:
        return rpc.call(self.stub.SubmitJob, trainer_pb2.SubmitJobRequest(
            team=team, manifest_json=manifest(job_id or "job", **resources), job_id=job_id, idempotency_key=key,
            submitted_by="key-1"))

    def get(self, team: str, job_id: str) -> common_pb2.Job:
        return rpc.call(self.stub.GetJob, trainer_pb2.GetJobRequest(team=team, job_id=job_id))

    def jobs(self, team: str) -> list[common_pb2.Job]:
        return list(rpc.call(self.stub.ListJobs, trainer_pb2.ListJobsRequest(team=team, limit=1000)).jobs)

    def set_quota(self, team: str, **limits) -> trainer_pb2.TeamUsage:
        return rpc.call(self.stub.SetQuota, trainer_pb2.SetQuotaRequest(
            team=team, quota=trainer_pb2.Quota(**limits), actor="admin:root"))

    def usage(self, team: str) -> trainer_pb2.TeamUsage:
        return rpc.call(self.stub.GetTeamUsage, trainer_pb2.GetTeamUsageRequest(team=team))

    def all_usage(self) -> list[trainer_pb2.TeamUsage]:
        return list(rpc.call(self.stub.ListUsage, trainer_pb2.ListUsageRequest()).teams)

    def report(self, job_id: str, state: JobState) -> common_pb2.Job:
        return rpc.call(self.stub.ReportJobStatus, trainer_pb2.ReportJobStatusRequest(
            job_id=job_id, attempt=1, state=state, reason=state.name.lower(), actor="monitor"))

    def complete(self, job_id: str) -> common_pb2.Job:
        for state in (JobState.RUNNING, JobState.STORING):
            self.report(job_id, state)
        return self.report(job_id, JobState.COMPLETED)

    def wait_state(self, team: str, job_id: str, state: JobState) -> common_pb2.Job:
        return wait_for(lambda: (j := self.get(team, job_id)).state == state and j, 10,
                        f"{job_id} to become {state.name}")

    def wait_queued(self, team: str, job_id: str, reason: str, position: int) -> common_pb2.Job:
        def current() -> common_pb2.Job | None:
            j = self.get(team, job_id)
            return j if (j.state, j.reason, j.queue_position) == (JobState.QUEUED, reason, position) else None

        try:
            return wait_for(current, 10, f"{job_id} queued at {position}: {reason}")
        except TimeoutError:
            j = self.get(team, job_id)
            raise AssertionError(f"{job_id}: {JobState(j.state).name} at {j.queue_position}: {j.reason}") from None


def test_set_get_and_list_usage(tf, fake_lcm):
    usage = tf.set_quota("a", gpus=4, memory=16 * GI, jobs=3, gpus_by_type={"a100": 2})
    assert usage.team == "a" and usage.quota == trainer_pb2.Quota(gpus=4, memory=16 * GI, jobs=3,
                                                                 gpus_by_type={"a100": 2})
    assert not usage.quota.HasField("cpus")
    assert usage.in_use == trainer_pb2.Quota(gpus=0, cpus=0, memory=0, jobs=0)

    tf.submit("a", "train", gpus=1, learners=2, cpus=1.5, gpu_type="a100")
    tf.submit("b", "other", cpus=2)
    tf.wait_state("a", "train", JobState.DEPLOYING)
    tf.wait_state("b", "other", JobState.DEPLOYING)
    usage = tf.usage("a")
    assert usage.in_use == trainer_pb2.Quota(gpus=2, cpus=3, memory=2 * GI, jobs=1, gpus_by_type={"a100": 2})
    assert (usage.active_jobs, usage.queued_jobs) == (1, 0)

    # a quota replaced whole: what is left out is no longer limited
    assert tf.set_quota("a", cpus=8).quota == trainer_pb2.Quota(cpus=8)
    listed = tf.all_usage()
    assert [u.team for u in listed] == ["a", "b"]
    assert (listed[1].quota, listed[1].in_use.cpus, listed[1].active_jobs) == (trainer_pb2.Quota(), 2, 1)
    assert tf.usage("nobody") == trainer_pb2.TeamUsage(team="nobody", quota=trainer_pb2.Quota(),
                                                       in_use=trainer_pb2.Quota(gpus=0, cpus=0, memory=0, jobs=0),
                                                       borrowed=trainer_pb2.Quota(gpus=0, cpus=0, memory=0))


def test_a_teams_egress_policy_is_kept_with_its_quota_and_sent_with_each_deploy(tf, fake_lcm):
    usage = tf.set_quota("a", jobs=3, egress="store,PyPI.internal:443")
    assert usage.quota.egress == "store,pypi.internal:443", "normalised"
    assert tf.usage("a").quota.egress == "store,pypi.internal:443" and not tf.usage("b").quota.HasField("egress")
    tf.submit("a", "train", cpus=1)
    tf.submit("b", "other", cpus=1)
    tf.wait_state("a", "train", JobState.DEPLOYING)
    tf.wait_state("b", "other", JobState.DEPLOYING)

    def deployed() -> dict:  # the deploy call follows the DEPLOYING write, from another thread
        found = {json.loads(d.manifest_json)["name"]: d for d in list(fake_lcm.deploys)}
        return found if {"train", "other"} <= found.keys() else {}

    by_team = wait_for(deployed, 30, "both deploys to reach the LCM")
    assert by_team["train"].team_quota.egress == "store,pypi.internal:443"
    assert not by_team["other"].team_quota.HasField("egress"), "a team without a policy of its own: the admin's"


def test_a_bad_quota_is_refused_naming_its_fields(tf):
    with pytest.raises(InvalidArgument) as err:
        tf.set_quota("a", gpus=-1, gpus_by_type={"A100": 1})
    assert [d["field"] for d in err.value.details] == ["quota.gpus", "quota.gpus_by_type.A100"]
    with pytest.raises(InvalidArgument) as err:
        tf.set_quota("a", egress="pypi.internal")
    assert [d["field"] for d in err.value.details] == ["quota.egress"]
    with pytest.raises(grpc.RpcError) as raw:
        tf.stub.SetQuota(trainer_pb2.SetQuotaRequest(quota=trainer_pb2.Quota(gpus=1)))
    assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(InvalidArgument) as err:
        tf.set_quota("a", gpus=2, lending_limit=trainer_pb2.ResourceLimits(gpus=3, cpus=1))
    assert [d["field"] for d in err.value.details] == ["quota.lending_limit.gpus", "quota.lending_limit.cpus"]
    assert "set quota.cohort" in err.value.details[0]["message"]
    with pytest.raises(InvalidArgument) as err:
        tf.set_quota("a", gpus=2, cohort="lab", lending_limit=trainer_pb2.ResourceLimits(gpus=3, cpus=1))
    assert [d["message"] for d in err.value.details] == [
        "must be at most quota.gpus (2)", "needs quota.cpus: a team lends and borrows only what it has a limit for"]


def test_a_cohort_quota_round_trips_and_a_job_beyond_the_teams_own_quota_borrows(tf, fake_lcm):
    usage = tf.set_quota("a", gpus=1, cohort="lab", borrowing_limit=trainer_pb2.ResourceLimits(gpus=1))
    assert usage.quota == trainer_pb2.Quota(gpus=1, cohort="lab", borrowing_limit=trainer_pb2.ResourceLimits(gpus=1))
    tf.set_quota("b", gpus=4, cohort="lab")
    tf.submit("a", "wide", gpus=1, learners=2)  # 2 GPUs: 1 of its own, 1 borrowed from b
    wide = tf.wait_state("a", "wide", JobState.DEPLOYING)
    assert wide.borrowed == common_pb2.Borrowed(cohort="lab", gpus=1)
    assert tf.usage("a").borrowed == trainer_pb2.Quota(gpus=1, cpus=0, memory=0)
    with pytest.raises(InvalidArgument, match="team quota is 2"):  # its own 1 + a borrowing limit of 1
        tf.submit("a", "wider", gpus=1, learners=3)


def test_over_quota_jobs_wait_with_reason_and_position_then_run_when_room_frees(tf, fake_lcm):
    tf.set_quota("a", gpus=4)
    tf.submit("a", "a1", gpus=4)
    tf.wait_state("a", "a1", JobState.DEPLOYING)
    tf.submit("a", "a2", gpus=2)
    tf.submit("a", "a3", gpus=1)
    tf.submit("b", "b1", gpus=2)  # b has no quota: only the backend's 8 GPUs limit it
    tf.wait_state("b", "b1", JobState.DEPLOYING)
    tf.wait_queued("a", "a2", "needs 2 GPUs; team quota 4, in use 4", 1)
    tf.wait_queued("a", "a3", "needs 1 GPU; team quota 4, in use 4", 2)
    usage = tf.usage("a")
    assert (usage.in_use.gpus, usage.active_jobs, usage.queued_jobs) == (4, 1, 2)

    tf.complete("a1")
    tf.wait_state("a", "a2", JobState.DEPLOYING)
    tf.wait_state("a", "a3", JobState.DEPLOYING)
    assert tf.usage("a").in_use.gpus == 3


@pytest.mark.parametrize("fake_lcm", [{"cpus": 2}], indirect=True)
def test_capacity_reason_names_the_backend(tf):
    tf.submit("a", "a1", cpus=1.5)
    tf.wait_state("a", "a1", JobState.DEPLOYING)
    tf.submit("a", "a2", cpus=1)
    tf.wait_queued("a", "a2", "needs 1 CPU; capacity 2, in use 1.5", 1)


def test_a_job_bigger_than_the_whole_quota_is_refused_at_submit(tf):
    tf.set_quota("a", gpus=4, gpus_by_type={"a100": 2}, jobs=2)
    with pytest.raises(InvalidArgument, match="^needs 6 GPUs but team quota is 4$") as err:
        tf.submit("a", "huge", gpus=3, learners=2)
    assert err.value.details == [{"field": "resources.gpus", "message": "needs 6 GPUs but team quota is 4"}]
    with pytest.raises(InvalidArgument, match="needs 3 a100 GPUs but team quota for a100 is 2") as err:
        tf.submit("a", "typed", gpus=3, gpu_type="a100")
    assert err.value.details[0]["field"] == "resources.gpu_type"
    with pytest.raises(InvalidArgument, match="needs 10 GPUs but the backend has 8; needs 10 GPUs but team quota"):
        tf.submit("a", "wide", gpus=10)
    tf.set_quota("frozen", jobs=0)
    with pytest.raises(InvalidArgument, match="team quota allows no running jobs"):
        tf.submit("frozen", "any")
    assert tf.jobs("a") == [] and tf.jobs("frozen") == []
    assert tf.submit("b", "fine", gpus=6).state in (JobState.QUEUED, JobState.DEPLOYING)


def test_lowering_a_quota_fails_queued_jobs_that_can_never_fit_and_keeps_running_ones(tf):
    tf.set_quota("a", gpus=4)
    tf.submit("a", "running", gpus=4)
    tf.wait_state("a", "running", JobState.DEPLOYING)
    tf.submit("a", "big", gpus=3)
    tf.submit("a", "small", gpus=1)
    tf.wait_queued("a", "small", "needs 1 GPU; team quota 4, in use 4", 2)
    tf.set_quota("a", gpus=2)
    big = tf.wait_state("a", "big", JobState.FAILED)
    assert big.reason == "needs 3 GPUs but team quota is 2"
    tf.wait_queued("a", "small", "needs 1 GPU; team quota 2, in use 4", 1)
    assert tf.get("a", "running").state == JobState.DEPLOYING


@pytest.mark.parametrize("fake_lcm", [{"cpus": 4}], indirect=True)
def test_a_team_flooding_the_queue_does_not_delay_another_teams_job(tf, fake_lcm):
    flood = [f"a{i:02d}" for i in range(12)]
    for job_id in flood:
        tf.submit("a", job_id, cpus=1)
    wait_for(lambda: len(fake_lcm.deployed()) == 4, 10, "four of a's jobs to start")
    tf.submit("b", "b1", cpus=1)
    tf.wait_queued("b", "b1", "needs 1 CPU; capacity 4, in use 4", 1)
    tf.wait_queued("a", "a11", "needs 1 CPU; capacity 4, in use 4", 8)

    # the next free slot goes to b, although a's 8 waiting jobs came first
    tf.complete(fake_lcm.deployed()[0])
    tf.wait_state("b", "b1", JobState.DEPLOYING)
    assert [j for j in flood if tf.get("a", j).state == JobState.QUEUED] == flood[4:]
    tf.wait_queued("a", "a11", "needs 1 CPU; capacity 4, in use 4", 8)
    # and then a's oldest waiting job, first come first served within a
    tf.complete(fake_lcm.deployed()[1])
    tf.wait_state("a", "a04", JobState.DEPLOYING)
    tf.wait_queued("a", "a11", "needs 1 CPU; capacity 4, in use 4", 7)


@pytest.mark.parametrize("fake_lcm", [{"cpus": 2}], indirect=True)
def test_priority_passes_fairness(tf, fake_lcm):
    tf.submit("a", "a1", cpus=2)
    tf.wait_state("a", "a1", JobState.DEPLOYING)
    tf.submit("b", "b-normal", cpus=2)
    tf.submit("a", "a-high", cpus=2, priority="high")
    tf.wait_queued("a", "a-high", "needs 2 CPUs; capacity 2, in use 2", 1)
    tf.complete("a1")
    tf.wait_state("a", "a-high", JobState.DEPLOYING)
    assert tf.get("b", "b-normal").state == JobState.QUEUED


def test_gpu_seconds_are_counted_when_a_job_finishes(tf):
    tf.submit("a", "train", gpus=1, learners=2, cpus=1.5)
    tf.wait_state("a", "train", JobState.DEPLOYING)
    done = tf.complete("train")
    started = next(e.timestamp for e in done.history if e.to_state == JobState.DEPLOYING)
    ended = next(e.timestamp for e in done.history if e.to_state == JobState.COMPLETED)
    usage = tf.usage("a")
    assert usage.gpu_seconds == pytest.approx((ended - started) * 2, abs=1e-4) and usage.gpu_seconds > 0
    assert usage.cpu_seconds == pytest.approx((ended - started) * 3, abs=1e-4)
    assert (usage.active_jobs, usage.in_use.gpus) == (0, 0)
    # a cancelled job counts too, and adds to what the team already used
    tf.submit("a", "again", gpus=1)
    tf.wait_state("a", "again", JobState.DEPLOYING)
    cancelled = rpc.call(tf.stub.CancelJob, trainer_pb2.CancelJobRequest(team="a", job_id="again", actor="u"))
    span = cancelled.history[-1].timestamp - next(e.timestamp for e in cancelled.history
                                                  if e.to_state == JobState.DEPLOYING)
    assert tf.usage("a").gpu_seconds == pytest.approx(usage.gpu_seconds + span, abs=1e-4)


def test_a_halted_job_stops_counting_and_frees_its_quota(tf):
    tf.set_quota("a", gpus=2)
    tf.submit("a", "long", gpus=2)
    tf.wait_state("a", "long", JobState.DEPLOYING)
    tf.submit("a", "next", gpus=2)
    tf.wait_queued("a", "next", "needs 2 GPUs; team quota 2, in use 2", 1)
    for state in (JobState.RUNNING, JobState.HALTING):
        tf.report("long", state)
    halted = tf.report("long", JobState.HALTED)
    span = halted.history[-1].timestamp - next(e.timestamp for e in halted.history
                                               if e.to_state == JobState.DEPLOYING)
    tf.wait_state("a", "next", JobState.DEPLOYING)
    usage = tf.usage("a")
    assert (usage.in_use.gpus, usage.active_jobs) == (2, 1)
    # what `long` used, plus the few moments `next` has run so far
    assert usage.gpu_seconds >= span * 2 - 1e-4 and usage.gpu_seconds < span * 2 + 60


def test_a_retried_submit_returns_the_first_job(tf, fake_lcm):
    first = tf.submit("a", key="retry-1", cpus=2)
    again = tf.submit("a", key="retry-1", cpus=2)
    assert again.id == first.id
    # the key belongs to the team: another team's same key is another job
    assert tf.submit("b", key="retry-1", cpus=2).id != first.id
    with pytest.raises(Conflict, match="idempotency key 'retry-1' was already used"):
        tf.submit("a", key="retry-1", cpus=3)
    with pytest.raises(grpc.RpcError) as raw:
        tf.stub.SubmitJob(trainer_pb2.SubmitJobRequest(team="a", manifest_json=manifest("job", cpus=3),
                                                       idempotency_key="retry-1"))
    assert raw.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    tf.wait_state("a", first.id, JobState.DEPLOYING)
    tf.complete(first.id)
    # still the same job once it has ended
    assert tf.submit("a", key="retry-1", cpus=2).state == JobState.COMPLETED
    assert len(tf.jobs("a")) == 1


def test_a_retry_returns_the_first_job_even_once_its_team_quota_would_refuse_it(tf, fake_lcm):
    tf.set_quota("a", cpus=4)
    first = tf.submit("a", key="before-the-cut", cpus=3)
    tf.set_quota("a", cpus=2)
    assert tf.submit("a", key="before-the-cut", cpus=3).id == first.id
    with pytest.raises(InvalidArgument, match="^needs 3 CPUs but team quota is 2$"):
        tf.submit("a", key="after-the-cut", cpus=3)
    with pytest.raises(Conflict, match="idempotency key 'before-the-cut' was already used"):
        tf.submit("a", key="before-the-cut", cpus=1)


def test_a_retry_finishes_a_submit_that_died_before_admission(tf, mongo_db, unique, fake_lcm):
    store = JobStore(mongo_db, collection=f"jobs_{unique}")
    store.insert("orphan", "a", parse_manifest(manifest("job", cpus=1)), idempotency_key="k")
    job = tf.submit("a", key="k", cpus=1)
    assert (job.id, job.state) == ("orphan", JobState.QUEUED)
    tf.wait_state("a", "orphan", JobState.DEPLOYING)
    assert [j.id for j in tf.jobs("a")] == ["orphan"]


def test_concurrent_retries_make_one_job(tf, fake_lcm):
    barrier = threading.Barrier(16)

    def submit(_: int) -> str:
        barrier.wait()
        return tf.submit("a", key="storm", cpus=1).id

    with ThreadPoolExecutor(16) as pool:
        ids = set(pool.map(submit, range(16)))
    assert len(ids) == 1
    assert [j.id for j in tf.jobs("a")] == list(ids)
    wait_for(lambda: fake_lcm.deployed() == list(ids), 10, "one deploy")


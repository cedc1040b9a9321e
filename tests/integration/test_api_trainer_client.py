"""The API's Trainer client against a real gRPC server: REST job shape and domain errors across the wire."""

from __future__ import annotations

import pytest

from tests.servers import free_port
from trainforge_protos import common_pb2, trainer_pb2, trainer_pb2_grpc
from trainforge_services.api.trainer_client import TrainerClient
from trainforge_services.common import rpc
from trainforge_services.common.errors import Conflict, NotFound, Unavailable
from trainforge_services.common.states import JobState, LearnerState

JOB = common_pb2.Job(
    id="j-0123456789ab", team="alpha", name="mnist", state=JobState.RUNNING, reason="every learner started",
    attempt=1, manifest_json='{"name": "mnist", "learners": 2}', created_at=100.0, updated_at=130.5,
    submitted_by="abcd1234",
    history=[common_pb2.StatusEvent(from_state=0, to_state=JobState.PENDING, reason="submitted", actor="user:abcd1234",
                                    timestamp=100.0),
             common_pb2.StatusEvent(from_state=JobState.PENDING, to_state=JobState.QUEUED, reason="fits",
                                    actor="trainer", timestamp=101.0)],
    learners=[common_pb2.LearnerStatus(rank=1, state=LearnerState.LEARNER_FAILED, exit_code=3, attempt=1,
                                       message="exit code 3"),
              common_pb2.LearnerStatus(rank=0, state=LearnerState.LEARNER_RUNNING, attempt=1)],
)


class FakeTrainer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self):
        self.requests = []

    @rpc.handler
    def SubmitJob(self, request, context):  # noqa: N802 - gRPC names
        self.requests.append(request)
        if request.job_id == "j-taken":
            raise Conflict("job j-taken already exists")
        return JOB

    @rpc.handler
    def GetJob(self, request, context):  # noqa: N802
        self.requests.append(request)
        if request.team != "alpha":
            raise NotFound(f"job {request.job_id} not found")
        return JOB

    @rpc.handler
    def ListJobs(self, request, context):  # noqa: N802
        self.requests.append(request)
        return trainer_pb2.ListJobsResponse(jobs=[JOB, JOB], as_of=request.changed_after + 1.5)

    @rpc.handler
    def CancelJob(self, request, context):  # noqa: N802
        self.requests.append(request)
        return common_pb2.Job(id=request.job_id, team=request.team, state=JobState.CANCELLED)

    @rpc.handler
    def Health(self, request, context):  # noqa: N802
        return trainer_pb2.HealthResponse(status="ok")


@pytest.fixture
def served():
    fake = FakeTrainer()
    server, port = rpc.make_server("127.0.0.1:0")
    trainer_pb2_grpc.add_TrainerServicer_to_server(fake, server)
    server.start()
    client = TrainerClient(f"127.0.0.1:{port}", timeout=5)
    yield fake, client
    client.close()
    server.stop(0)


def test_jobs_come_back_in_the_rest_shape(served):
    fake, client = served
    job = client.get_job("alpha", JOB.id)
    assert job == {
        "id": "j-0123456789ab", "team": "alpha", "name": "mnist", "state": "running",
        "reason": "every learner started", "queue_position": 0, "attempt": 1, "created_at": 100.0,
        "updated_at": 130.5, "manifest": {"name": "mnist", "learners": 2}, "outputs_uri": "",
        "submitted_by": "abcd1234", "restarts": 0, "checkpoint_step": None, "not_before": 0.0,
        "borrowed": None, "preemptions": 0, "preempted": "", "world_size": None,
        "learners": [{"rank": 0, "state": "running", "exit_code": None, "attempt": 1, "message": "",
                      "isolation": ""},
                     {"rank": 1, "state": "failed", "exit_code": 3, "attempt": 1, "message": "exit code 3",
                      "isolation": ""}],
        "history": [{"from": "unspecified", "to": "pending", "reason": "submitted", "actor": "user:abcd1234",
                     "timestamp": 100.0, "borrowed": None, "grown": None},
                    {"from": "pending", "to": "queued", "reason": "fits", "actor": "trainer", "timestamp": 101.0,
                     "borrowed": None, "grown": None}],
    }


def test_requests_carry_every_field(served):
    fake, client = served
    client.submit_job(team="alpha", manifest_json="{}", code_uri="store://jobs/j-1/code.tar.gz",
                      submitted_by="abcd1234", job_id="j-1")
    client.list_jobs("alpha", limit=7, states=[JobState.RUNNING, JobState.QUEUED])
    assert client.cancel_job("alpha", "j-1", actor="user:abcd1234")["state"] == "cancelled"
    submit, listing, cancel = fake.requests
    assert (submit.team, submit.code_uri, submit.submitted_by, submit.job_id) == (
        "alpha", "store://jobs/j-1/code.tar.gz", "abcd1234", "j-1")
    assert (listing.limit, list(listing.states)) == (7, [JobState.RUNNING, JobState.QUEUED])
    assert cancel.actor == "user:abcd1234"
    assert client.health() == "ok"


def test_a_listing_of_what_changed_carries_changed_after_and_answers_as_of(served):
    fake, client = served
    jobs, as_of = client.list_jobs_as_of("alpha", changed_after=1700000000.25, limit=3)
    assert len(jobs) == 2 and as_of == 1700000001.75
    assert (fake.requests[-1].changed_after, fake.requests[-1].limit) == (1700000000.25, 3)
    client.list_jobs("alpha")
    assert fake.requests[-1].changed_after == 0.0  # a plain listing asks for every job


def test_domain_errors_cross_the_wire(served):
    _, client = served
    with pytest.raises(NotFound, match="job j-x not found"):
        client.get_job("beta", "j-x")
    with pytest.raises(Conflict):
        client.submit_job(team="alpha", manifest_json="{}", code_uri="", submitted_by="k", job_id="j-taken")


def test_a_missing_trainer_is_unavailable():
    client = TrainerClient(f"127.0.0.1:{free_port()}", timeout=2, health_timeout=1)
    try:
        with pytest.raises(Unavailable):
            client.health()
    finally:
        client.close()

"""The Trainer end to end over gRPC, against the real MongoDB-wire server and a fake LCM.

The fake LCM is a real in-process gRPC server, so the Trainer's own LCM
client, error mapping and background calls are all exercised. The dispatch
interval is long: every dispatch here must come from a wake-up (a submit or a
job ending), not from the periodic pass.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from tests.servers import free_port, wait_for
from trainforge_protos import common_pb2, lcm_pb2, lcm_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import rpc, rpcauth
from trainforge_services.common.errors import Conflict, InvalidArgument, NotFound
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.common.settings import TrainerSettings
from trainforge_services.common.states import JobState, LearnerState
from trainforge_services.trainer.store import JobStore
from trainforge_services.trainer.wiring import serve

GI = 2**30
SECRETS_KEY = "0" * 43 + "="  # a well-formed Fernet key (32 zero-ish bytes), for processes outside dev mode
# the service token and credentials key of processes outside dev mode
SERVICE_KEYS = {"TF_SERVICE_TOKEN": "s" * 40, "TF_CREDENTIALS_KEY": "c" * 40}


class FakeLcm(lcm_pb2_grpc.LifecycleManagerServicer):
    """Records what the Trainer asks for; fails DeployJob for manifests named `fail-*`."""

    def __init__(self, gpus: int = 0, cpus: float = 4, memory: int = 64 * GI, max_learners: int = 8):
        self.capacity = lcm_pb2.Capacity(backend="fake", max_learners=max_learners,
                                         total=common_pb2.Resources(gpus=gpus, cpus=cpus, memory=memory))
        self.deploys: list[lcm_pb2.DeployJobRequest] = []
        self.kills: list[str] = []
        self.halts: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def DeployJob(self, request, context):  # noqa: ANN001
        with self._lock:
            self.deploys.append(request)
        if json.loads(request.manifest_json)["name"].startswith("fail-"):
            body = json.dumps({"message": "backend exploded", "details": []})
            context.abort(grpc.StatusCode.INTERNAL, body)
        return lcm_pb2.DeployJobResponse(handles=[f"pid:{len(self.deploys)}"])

    def KillJob(self, request, context):  # noqa: ANN001
        with self._lock:
            self.kills.append(request.job_id)
        return lcm_pb2.KillJobResponse(killed=1)

    def HaltJob(self, request, context):  # noqa: ANN001
        with self._lock:
            self.halts.append((request.job_id, request.attempt))
        return lcm_pb2.LcmHaltJobResponse()

    def GetCapacity(self, request, context):  # noqa: ANN001
        return self.capacity

    def Health(self, request, context):  # noqa: ANN001
        return lcm_pb2.LcmHealthResponse(status="ok")

    def deployed(self) -> list[str]:
        with self._lock:
            return [d.job_id for d in self.deploys]


@pytest.fixture
def fake_lcm():
    lcm = FakeLcm()
    server, port = rpc.make_server("127.0.0.1:0")
    lcm_pb2_grpc.add_LifecycleManagerServicer_to_server(lcm, server)
    server.start()
    lcm.address = f"127.0.0.1:{port}"
    yield lcm
    server.stop(0).wait()


def trainer_settings(mongo_server, unique, tmp_path, lcm_address: str) -> TrainerSettings:
    return TrainerSettings(state_dir=tmp_path, dev_mode=True, mongo_url=mongo_server.url,
                           mongo_db=f"tf{unique}", trainer_address="127.0.0.1:0", lcm_address=lcm_address,
                           dispatch_interval=60, lcm_timeout=5)


@pytest.fixture
def trainer(mongo_server, unique, tmp_path, fake_lcm):
    t = serve(trainer_settings(mongo_server, unique, tmp_path, fake_lcm.address), collection=f"jobs_{unique}")
    yield t
    t.stop(grace=0)


@pytest.fixture
def client(trainer, tmp_path):
    # the service token the Trainer generated into its state dir (dev mode), as every platform service presents it
    token = rpcauth.load_service_token("", dev_mode=True, state_dir=tmp_path)
    channel = rpc.channel(trainer.address, authorization=f"Bearer {token}")
    yield Client(trainer_pb2_grpc.TrainerStub(channel))
    channel.close()


class Client:
    """The Trainer's RPCs as the API would call them, with domain errors."""

    def __init__(self, stub: trainer_pb2_grpc.TrainerStub):
        self.stub = stub

    def submit(self, name: str, *, cpus: float = 1, gpus: int = 0, team: str = "t", priority: str = "normal",
               job_id: str = "") -> common_pb2.Job:
        manifest = {"name": name, "command": "python train.py", "priority": priority,
                    "resources": {"cpus": cpus, "gpus": gpus, "memory": "1Gi"}}
        return rpc.call(self.stub.SubmitJob, trainer_pb2.SubmitJobRequest(
            # the job's own archive, as the API stores it (another job's is refused: services/common/storeaccess.py)
            team=team, manifest_json=json.dumps(manifest), code_uri=f"store://jobs/{job_id}/code.tar.gz" if job_id else "",
            submitted_by="key-1", job_id=job_id))

    def get(self, job_id: str, team: str = "t") -> common_pb2.Job:
        return rpc.call(self.stub.GetJob, trainer_pb2.GetJobRequest(team=team, job_id=job_id))

    def cancel(self, job_id: str, team: str = "t") -> common_pb2.Job:
        return rpc.call(self.stub.CancelJob, trainer_pb2.CancelJobRequest(team=team, job_id=job_id,
                                                                          actor="user:alice"))

    def report(self, job_id: str, state: JobState, *, attempt: int = 1, reason: str = "", learners=(),
               outputs_uri: str = "") -> common_pb2.Job:
        return rpc.call(self.stub.ReportJobStatus, trainer_pb2.ReportJobStatusRequest(
            job_id=job_id, attempt=attempt, state=state, reason=reason or state.name.lower(), actor="monitor",
            learners=list(learners), outputs_uri=outputs_uri))

    def wait_state(self, job_id: str, state: JobState, team: str = "t") -> common_pb2.Job:
        return wait_for(lambda: (j := self.get(job_id, team)).state == state and j, 10,
                        f"{job_id} to become {state.name}")


def learner(rank: int, state: LearnerState) -> common_pb2.LearnerStatus:
    return common_pb2.LearnerStatus(rank=rank, state=state, attempt=1)


def complete(client: Client, job_id: str) -> common_pb2.Job:
    client.report(job_id, JobState.RUNNING, learners=[learner(0, LearnerState.LEARNER_RUNNING)])
    client.report(job_id, JobState.STORING, learners=[learner(0, LearnerState.LEARNER_STORING)])
    return client.report(job_id, JobState.COMPLETED, learners=[learner(0, LearnerState.LEARNER_COMPLETED)],
                         outputs_uri=f"store://jobs/{job_id}/outputs/")


def test_a_job_that_fits_is_deployed(client, fake_lcm):
    job = client.submit("mnist", cpus=2, job_id="first")
    assert (job.id, job.state, job.team, job.submitted_by) == ("first", JobState.QUEUED, "t", "key-1")
    job = client.wait_state("first", JobState.DEPLOYING)
    wait_for(lambda: fake_lcm.deployed() == ["first"], 10, "DeployJob")
    deploy = fake_lcm.deploys[0]
    assert (deploy.team, deploy.attempt, deploy.code_uri, deploy.checkpoint_uri) == \
        ("t", 1, "store://jobs/first/code.tar.gz", "")
    assert parse_manifest(deploy.manifest_json).resources.cpus == 2
    assert [(e.from_state, e.to_state) for e in job.history] == [
        (JobState.JOB_STATE_UNSPECIFIED, JobState.PENDING), (JobState.PENDING, JobState.QUEUED),
        (JobState.QUEUED, JobState.DEPLOYING)]
    assert job.queue_position == 0


def test_generated_ids_look_like_job_ids(client):
    job = client.submit("mnist")
    assert job.id.startswith("j-") and len(job.id) == 14


def test_a_job_waits_with_reason_and_position_then_runs_when_room_frees(client, fake_lcm):
    client.submit("a", cpus=3, job_id="a")
    client.wait_state("a", JobState.DEPLOYING)
    client.submit("b", cpus=2, job_id="b")
    client.submit("c", cpus=3, job_id="c")
    client.submit("d", cpus=2, job_id="d", team="other")
    b = wait_for(lambda: (j := client.get("b")).queue_position == 1 and j, 10, "b's queue position")
    assert (b.state, b.reason) == (JobState.QUEUED, "needs 2 CPUs; capacity 4, in use 3")
    c = wait_for(lambda: (j := client.get("c")).queue_position == 2 and j, 10, "c's queue position")
    assert c.reason == "needs 3 CPUs; capacity 4, in use 3"
    d = wait_for(lambda: (j := client.get("d", "other")).queue_position == 1 and j, 10, "d's position")
    assert d.reason == "needs 2 CPUs; capacity 4, in use 3"

    done = complete(client, "a")
    assert done.state == JobState.COMPLETED and done.outputs_uri == "store://jobs/a/outputs/"
    assert [s.state for s in done.learners] == [LearnerState.LEARNER_COMPLETED]
    assert [e.to_state for e in done.history][-3:] == [JobState.RUNNING, JobState.STORING, JobState.COMPLETED]
    wait_for(lambda: "a" in fake_lcm.kills, 10, "KillJob of the completed job")
    # b goes first; c (3 CPUs) cannot follow it, but d (2 CPUs) still fits beside b
    client.wait_state("b", JobState.DEPLOYING)
    client.wait_state("d", JobState.DEPLOYING, team="other")
    c = wait_for(lambda: (j := client.get("c")).reason.endswith("in use 4") and j, 10, "c's new reason")
    assert (c.state, c.queue_position, c.reason) == (JobState.QUEUED, 1, "needs 3 CPUs; capacity 4, in use 4")
    assert sorted(fake_lcm.deployed()) == ["a", "b", "d"]


def test_higher_priority_goes_first(client, fake_lcm):
    client.submit("blocker", cpus=4, job_id="blocker")
    client.wait_state("blocker", JobState.DEPLOYING)
    client.submit("normal", cpus=4, job_id="normal")
    client.submit("urgent", cpus=4, job_id="urgent", priority="high")
    wait_for(lambda: client.get("normal").queue_position == 2, 10, "urgent to pass normal in the queue")
    client.cancel("blocker")
    client.wait_state("urgent", JobState.DEPLOYING)
    assert client.get("normal").state == JobState.QUEUED


def test_cancel_ends_the_job_and_removes_its_learners(client, fake_lcm):
    client.submit("mnist", job_id="j")
    client.wait_state("j", JobState.DEPLOYING)
    job = client.cancel("j")
    assert (job.state, job.reason) == (JobState.CANCELLED, "cancelled by user:alice")
    assert (job.history[-1].from_state, job.history[-1].actor) == (JobState.DEPLOYING, "user:alice")
    wait_for(lambda: "j" in fake_lcm.kills, 10, "KillJob")
    assert client.cancel("j") == job


def test_a_finished_job_cannot_be_cancelled(client):
    client.submit("mnist", job_id="j")
    client.wait_state("j", JobState.DEPLOYING)
    complete(client, "j")
    with pytest.raises(Conflict, match="already completed"):
        client.cancel("j")
    with pytest.raises(grpc.RpcError) as raw:
        client.stub.CancelJob(trainer_pb2.CancelJobRequest(team="t", job_id="j", actor="user:alice"))
    assert raw.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_job_bigger_than_the_backend_is_refused_at_submit(client):
    request = trainer_pb2.SubmitJobRequest(team="t", manifest_json=json.dumps(
        {"name": "huge", "command": "x", "resources": {"gpus": 8, "cpus": 1}}))
    with pytest.raises(grpc.RpcError) as raw:
        client.stub.SubmitJob(request)
    assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(InvalidArgument, match="needs 8 GPUs but the backend has 0") as err:
        client.submit("huge", gpus=8)
    assert err.value.details == [{"field": "resources.gpus", "message": "needs 8 GPUs but the backend has 0"}]
    with pytest.raises(InvalidArgument, match="needs 8 CPUs but the backend has 4"):
        client.submit("wide", cpus=8)
    assert rpc.call(client.stub.ListJobs, trainer_pb2.ListJobsRequest(team="t")).jobs == []


def test_an_invalid_manifest_names_its_fields(client):
    manifest = json.dumps({"name": "Bad Name", "learners": 0})
    request = trainer_pb2.SubmitJobRequest(team="t", manifest_json=manifest)
    with pytest.raises(InvalidArgument) as err:
        rpc.call(client.stub.SubmitJob, request)
    assert {d["field"] for d in err.value.details} == {"name", "learners", "command"}


def test_a_failed_deploy_fails_the_job(client, fake_lcm):
    client.submit("fail-me", job_id="f")
    job = client.wait_state("f", JobState.FAILED)
    assert job.reason == "deploy failed: backend exploded"
    wait_for(lambda: "f" in fake_lcm.kills, 10, "KillJob after the failed deploy")


def test_reports_are_idempotent_and_stale_or_illegal_ones_ignored(client):
    client.submit("mnist", job_id="j")
    client.wait_state("j", JobState.DEPLOYING)
    running = client.report("j", JobState.RUNNING, learners=[learner(0, LearnerState.LEARNER_PREPARING)])
    again = client.report("j", JobState.RUNNING, learners=[learner(0, LearnerState.LEARNER_RUNNING)])
    assert len(again.history) == len(running.history)
    assert [s.state for s in again.learners] == [LearnerState.LEARNER_RUNNING]
    stale = client.report("j", JobState.FAILED, attempt=7, reason="old attempt died")
    assert stale.state == JobState.RUNNING
    illegal = client.report("j", JobState.COMPLETED, reason="skipped storing")
    assert illegal.state == JobState.RUNNING and len(illegal.history) == len(running.history)
    with pytest.raises(NotFound):
        client.report("missing", JobState.RUNNING)


def test_a_deploying_report_while_deploying_stores_the_preparing_reason_only(client):
    client.submit("mnist", job_id="p")
    deploying = client.wait_state("p", JobState.DEPLOYING)
    progress = client.report("p", JobState.DEPLOYING, reason="preparing: learner 0: installing numpy (12/40)",
                             learners=[learner(0, LearnerState.LEARNER_PREPARING)])
    assert (progress.state, progress.reason) == (JobState.DEPLOYING, "preparing: learner 0: installing numpy (12/40)")
    assert len(progress.history) == len(deploying.history)
    assert client.get("p").reason == "preparing: learner 0: installing numpy (12/40)"
    running = client.report("p", JobState.RUNNING, reason="all 1 learners started")
    late = client.report("p", JobState.DEPLOYING, reason="preparing: learner 0: environment ready")
    assert (late.state, late.reason) == (JobState.RUNNING, "all 1 learners started")
    assert len(late.history) == len(running.history)


def test_another_teams_job_is_not_found(client):
    client.submit("mnist", job_id="j")
    with pytest.raises(NotFound):
        client.get("j", team="other")
    with pytest.raises(NotFound):
        client.cancel("j", team="other")
    assert client.get("j").id == "j"


def test_list_is_newest_first_and_filters_by_state(client):
    for name in ("one", "two", "three"):
        client.submit(name, cpus=4, job_id=name)
    client.wait_state("one", JobState.DEPLOYING)

    def ids(**kw) -> list[str]:
        response = rpc.call(client.stub.ListJobs, trainer_pb2.ListJobsRequest(team="t", **kw))
        return [j.id for j in response.jobs]

    assert ids() == ["three", "two", "one"]
    assert ids(states=[JobState.QUEUED]) == ["three", "two"]
    assert ids(limit=1) == ["three"]


def test_list_changed_after_an_as_of_returns_what_changed_since_and_refuses_a_bad_time(client):
    client.submit("one", job_id="one")
    before = rpc.call(client.stub.ListJobs, trainer_pb2.ListJobsRequest(team="t"))
    assert [j.id for j in before.jobs] == ["one"] and 0 < before.as_of <= time.time()
    client.submit("two", job_id="two")
    after = rpc.call(client.stub.ListJobs, trainer_pb2.ListJobsRequest(team="t", changed_after=before.as_of))
    assert "two" in [j.id for j in after.jobs] and after.as_of >= before.as_of
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(InvalidArgument, match="changed_after"):
            rpc.call(client.stub.ListJobs, trainer_pb2.ListJobsRequest(team="t", changed_after=bad))


def test_health(client):
    assert rpc.call(client.stub.Health, trainer_pb2.HealthRequest()).status == "ok"


def test_without_the_lcm_jobs_wait_and_say_why(mongo_server, unique, tmp_path):
    settings = trainer_settings(mongo_server, unique, tmp_path, f"127.0.0.1:{free_port()}")
    trainer = serve(settings, collection=f"jobs_{unique}")
    channel = rpc.channel(trainer.address, authorization=rpcauth.service_authorization(settings))
    try:
        client = Client(trainer_pb2_grpc.TrainerStub(channel))
        client.submit("mnist", job_id="j")
        job = wait_for(lambda: (j := client.get("j")).queue_position == 1 and j, 10, "a queue reason")
        assert job.state == JobState.QUEUED and job.reason.startswith("waiting for the LCM: ")
    finally:
        channel.close()
        trainer.stop(grace=0)


def test_restart_admits_jobs_left_pending(mongo_server, mongo_db, unique, tmp_path, fake_lcm):
    store = JobStore(mongo_db, collection=f"jobs_{unique}")
    store.insert("orphan", "t", parse_manifest({"name": "orphan", "command": "x"}))
    settings = trainer_settings(mongo_server, unique, tmp_path, fake_lcm.address)
    trainer = serve(settings, collection=f"jobs_{unique}")
    try:
        wait_for(lambda: fake_lcm.deployed() == ["orphan"], 10, "the orphan to be deployed")
        doc = store.find("orphan")
        assert doc.state == JobState.DEPLOYING
    finally:
        trainer.stop(grace=0)


def test_the_process_refuses_to_start_without_a_secrets_key_outside_dev_mode(mongo_server, unique, tmp_path):
    env = {**os.environ, "TF_MONGO_URL": mongo_server.url, "TF_MONGO_DB": f"tf{unique}",
           "TF_TRAINER_ADDRESS": f"127.0.0.1:{free_port()}", "TF_STATE_DIR": str(tmp_path), **SERVICE_KEYS}
    env.pop("TF_SECRETS_KEY", None)
    env.pop("TF_DEV_MODE", None)
    done = subprocess.run([sys.executable, "-m", "trainforge_services.trainer"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "secrets_key (TF_SECRETS_KEY) is required" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_process_serves_and_stops_on_sigterm(mongo_server, unique, tmp_path):
    port = free_port()
    env = {**os.environ, "TF_MONGO_URL": mongo_server.url, "TF_MONGO_DB": f"tf{unique}",
           "TF_TRAINER_ADDRESS": f"127.0.0.1:{port}", "TF_LCM_ADDRESS": f"127.0.0.1:{free_port()}",
           "TF_STATE_DIR": str(tmp_path), "TF_SECRETS_KEY": SECRETS_KEY, **SERVICE_KEYS}
    proc = subprocess.Popen([sys.executable, "-m", "trainforge_services.trainer"], env=env, stderr=subprocess.PIPE,
                            text=True)
    channel = rpc.channel(f"127.0.0.1:{port}", authorization=f"Bearer {SERVICE_KEYS['TF_SERVICE_TOKEN']}")
    try:
        stub = trainer_pb2_grpc.TrainerStub(channel)
        wait_for(lambda: rpc.call(stub.Health, trainer_pb2.HealthRequest(), timeout=1).status == "ok", 30,
                 "the Trainer process to answer")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        channel.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert f"trainer serving on 127.0.0.1:{port}" in stderr and "trainer stopped" in stderr

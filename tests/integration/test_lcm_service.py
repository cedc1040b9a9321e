"""The LCM over gRPC with its lifecycle on the local backend and real etcd: in-process, then as `python -m trainforge_services.lcm`.

Controllers are the fake interpreter of test_lcm_local.py, so these tests do
not depend on services/controller.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.integration.lcm_local.conftest import fake, gone, lcm_settings, lifecycles  # noqa: F401 - fixtures
from tests.servers import free_port, port_open, wait_for
from trainforge_protos import lcm_pb2, lcm_pb2_grpc
from trainforge_services.common import rpc
from trainforge_services.common.errors import Conflict, InvalidArgument, ResourceExhausted
from trainforge_services.common.manifest import Manifest
from trainforge_services.lcm.wiring import serve
from trainforge_services.trainer.lcm_client import GrpcLcm

# the LCMs here run outside dev mode, with these
SERVICE_TOKEN, CREDENTIALS_KEY = "s" * 40, "c" * 40
AUTHORIZATION = f"Bearer {SERVICE_TOKEN}"
MANIFEST = Manifest(name="mnist-ddp", learners=2, command="python train.py --lr {{lr}}", params={"lr": 0.1},
                    resources={"cpus": 1, "memory": "1Gi"})


def deploy_request(job: str, attempt: int = 1, manifest: Manifest = MANIFEST, **kw) -> lcm_pb2.DeployJobRequest:
    return lcm_pb2.DeployJobRequest(job_id=job, team="team-a", attempt=attempt,
                                    manifest_json=manifest.model_dump_json(), code_uri="", **kw)


@pytest.fixture
def lcm(lifecycles, lcm_settings):  # noqa: F811
    sizes = dict(local_gpus=1, local_cpus=4, local_memory=2**33, local_max_learners=8)
    settings = lcm_settings(**sizes, service_token=SERVICE_TOKEN)
    server, port = serve(settings, lifecycles(**sizes))
    channel = rpc.channel(f"127.0.0.1:{port}", authorization=AUTHORIZATION)
    stub = lcm_pb2_grpc.LifecycleManagerStub(channel)
    yield stub
    channel.close()
    server.stop(0).wait()


def test_deploy_kill_and_capacity_over_grpc(lcm, fake, coordinator, unique):  # noqa: F811
    job = f"j-{unique}"
    handles = list(rpc.call(lcm.DeployJob, deploy_request(job)).handles)
    assert [h.split(":")[0] for h in handles] == ["monitor", "controller-0", "controller-1"]
    fake.wait_runs(3)
    assert list(rpc.call(lcm.DeployJob, deploy_request(job)).handles) == handles, "deploy is not idempotent"
    assert len(fake.runs()) == 3
    pids = [int(h.split(":")[1]) for h in handles]
    assert all(psutil.pid_exists(p) for p in pids)
    assert coordinator.get(coordinator.keys.attempt(job))[0]["attempt"] == 1

    cap = rpc.call(lcm.GetCapacity, lcm_pb2.GetCapacityRequest())
    assert (cap.backend, cap.total.gpus, cap.total.cpus, cap.total.memory, cap.max_learners) == (
        "local", 1, 4.0, 2**33, 8)
    assert rpc.call(lcm.Health, lcm_pb2.LcmHealthRequest()).status == "ok"

    assert rpc.call(lcm.KillJob, lcm_pb2.KillJobRequest(job_id=job, reason="cancelled")).killed == 3
    assert all(gone(p) for p in pids)
    assert coordinator.list(coordinator.keys.job(job))[0] == {}
    assert rpc.call(lcm.KillJob, lcm_pb2.KillJobRequest(job_id=job)).killed == 0


def test_bad_requests_name_the_field(lcm, fake):  # noqa: F811
    with pytest.raises(InvalidArgument) as e:
        rpc.call(lcm.DeployJob, lcm_pb2.DeployJobRequest(job_id="j1", team="t", attempt=1,
                                                         manifest_json=json.dumps({"name": "x", "learners": 0})))
    fields = {d["field"] for d in e.value.details}
    assert {"learners", "command"} <= fields
    with pytest.raises(InvalidArgument, match="job_id '../etc' is not valid"):
        rpc.call(lcm.DeployJob, deploy_request("../etc"))
    with pytest.raises(InvalidArgument, match="attempt must be 1 or more"):
        rpc.call(lcm.DeployJob, deploy_request("j1", attempt=0))
    with pytest.raises(InvalidArgument, match="job_id"):
        rpc.call(lcm.KillJob, lcm_pb2.KillJobRequest(job_id=""))
    with pytest.raises(InvalidArgument) as e:
        rpc.call(lcm.SyncTeam, lcm_pb2.SyncTeamRequest(quota=lcm_pb2.TeamQuota(gpus=1)))
    assert e.value.details == [{"field": "team", "message": "required"}]
    with pytest.raises(InvalidArgument, match="invalid quota"):
        rpc.call(lcm.SyncTeam, lcm_pb2.SyncTeamRequest(team="t", quota=lcm_pb2.TeamQuota(cpus=-2)))
    with pytest.raises(InvalidArgument) as e:
        rpc.call(lcm.GrowJob, lcm_pb2.GrowJobRequest(job_id="j1", attempt=1, learners=0))
    assert e.value.details == [{"field": "learners", "message": "must be at least 1"}]
    with pytest.raises(InvalidArgument, match="attempt must be 1 or more"):
        rpc.call(lcm.GrowJob, lcm_pb2.GrowJobRequest(job_id="j1", attempt=0, learners=2))
    # a grant for an attempt that does not run here is answered, not an error
    assert not rpc.call(lcm.GrowJob, lcm_pb2.GrowJobRequest(job_id="j1", attempt=1, learners=2)).granted
    # a backend that keeps no copy of quotas says so
    assert not rpc.call(lcm.SyncTeam, lcm_pb2.SyncTeamRequest(team="t", quota=lcm_pb2.TeamQuota(gpus=1))).mirrored
    assert fake.runs() == []


def test_backend_refusals_reach_the_caller_as_domain_errors(lcm, fake, unique):  # noqa: F811
    gpu_job = MANIFEST.model_copy(update={"resources": MANIFEST.resources.model_copy(update={"gpus": 1})})
    with pytest.raises(ResourceExhausted, match=r"needs 2 GPU\(s\); the local backend has 1 of 1 free"):
        rpc.call(lcm.DeployJob, deploy_request(f"j-{unique}", manifest=gpu_job))
    rpc.call(lcm.DeployJob, deploy_request(f"j-{unique}", attempt=2))
    with pytest.raises(Conflict, match="older than the deployed attempt 2"):
        rpc.call(lcm.DeployJob, deploy_request(f"j-{unique}", attempt=1))
    rpc.call(lcm.KillJob, lcm_pb2.KillJobRequest(job_id=f"j-{unique}"))


def test_a_kill_naming_an_attempt_refuses_its_deploy_that_arrives_later(lifecycles, lcm_settings, fake,  # noqa: F811
                                                                        coordinator, unique):
    """The Trainer's client (GrpcLcm) cancels a job whose deploy has not reached the LCM: that attempt is
    marked killed in etcd, its late deploy is a Conflict that runs nothing, and the next attempt deploys."""
    sizes = dict(local_cpus=4, local_memory=2**33, local_max_learners=8)
    server, port = serve(lcm_settings(**sizes, service_token=SERVICE_TOKEN), lifecycles(**sizes))
    client = GrpcLcm(f"127.0.0.1:{port}", timeout=10, authorization=AUTHORIZATION)
    job = f"j-{unique}"
    try:
        assert client.kill_job(job, "cancelled", attempt=2) == 0
        assert coordinator.get(coordinator.keys.killed(job))[0]["attempt"] == 2
        with pytest.raises(Conflict, match=f"job {job} attempt 2 was killed; a new run needs attempt 3"):
            client.deploy_job(job, "team-a", 2, MANIFEST.model_dump_json(), "")
        assert fake.runs() == [] and coordinator.get(coordinator.keys.attempt(job))[0] is None
        with pytest.raises(InvalidArgument, match="attempt must be 1 or more"):
            client.kill_job(job, attempt=-1)
        assert client.kill_job(job) == 0  # naming no attempt keeps the mark
        assert coordinator.get(coordinator.keys.killed(job))[0]["attempt"] == 2
        handles = client.deploy_job(job, "team-a", 3, MANIFEST.model_dump_json(), "")
        assert len(handles) == 3
        fake.wait_runs(3)
        assert client.kill_job(job, "test over", attempt=3) == 3
        assert coordinator.get(coordinator.keys.killed(job))[0]["attempt"] == 3
    finally:
        server.stop(0).wait()


# -- the LCM as a process ---------------------------------------------------------


def spawn_lcm(tmp_path, etcd_server, coordinator, fake, port: int) -> subprocess.Popen:  # noqa: F811
    env = {**os.environ, "TF_STATE_DIR": str(tmp_path / "state"), "TF_ETCD_ENDPOINTS": etcd_server.address,
           "TF_ETCD_PREFIX": coordinator.keys.prefix, "TF_LCM_ADDRESS": f"127.0.0.1:{port}",
           "TF_PYTHON": str(fake.python), "TF_LOCAL_GPUS": "0", "TF_SERVICE_TOKEN": SERVICE_TOKEN,
           "TF_CREDENTIALS_KEY": CREDENTIALS_KEY}
    log = (tmp_path / f"lcm-{port}.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "trainforge_services.lcm"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    wait_for(lambda: port_open(port) or proc.poll() is not None, 30, "the LCM to listen")
    assert proc.poll() is None, (tmp_path / f"lcm-{port}.log").read_text()
    return proc


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_learners_outlive_an_lcm_restart_and_the_next_lcm_adopts_them(
        tmp_path, etcd_server, coordinator, fake, unique):  # noqa: F811
    port = free_port()
    job = f"j-{unique}"
    first = spawn_lcm(tmp_path, etcd_server, coordinator, fake, port)
    try:
        with rpc.channel(f"127.0.0.1:{port}", authorization=AUTHORIZATION) as channel:
            stub = lcm_pb2_grpc.LifecycleManagerStub(channel)
            handles = list(rpc.call(stub.DeployJob, deploy_request(job)).handles)
        fake.wait_runs(3)
    finally:
        assert stop(first) == 0
    pids = [int(h.split(":")[1]) for h in handles]
    assert not any(gone(p) for p in pids), "stopping the LCM stopped its learners"

    second = spawn_lcm(tmp_path, etcd_server, coordinator, fake, port)
    try:
        with rpc.channel(f"127.0.0.1:{port}", authorization=AUTHORIZATION) as channel:
            stub = lcm_pb2_grpc.LifecycleManagerStub(channel)
            assert list(rpc.call(stub.DeployJob, deploy_request(job)).handles) == handles
            assert len(fake.runs()) == 3
            assert rpc.call(stub.KillJob, lcm_pb2.KillJobRequest(job_id=job)).killed == 3
        wait_for(lambda: all(gone(p) for p in pids), 10, "the adopted processes to be killed")
    finally:
        assert stop(second) == 0

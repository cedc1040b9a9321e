"""Who may call the Trainer's and the LCM's gRPC (common/rpcauth.py), against the real servers.

Every RPC of either service is called without a credential and with a
wrong one, and refused; the standard health service answers anyone. A job
monitor's own token reports for its job only, calls nothing else, and is
refused once its job has ended and been cleaned up.
"""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.conftest import backend_maker
from tests.integration.lcm_local.conftest import fake, lcm_settings, lifecycles  # noqa: F401 - fixtures
from tests.integration.test_trainer_service import (  # noqa: F401 - fixtures
    SECRETS_KEY,
    Client,
    complete,
    fake_lcm,
    learner,
    trainer,
    trainer_settings,
)
from tests.servers import free_port, wait_for
from trainforge_protos import lcm_pb2, lcm_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import jobcreds, rpc, rpcauth
from trainforge_services.common.errors import PermissionDenied, Unauthenticated
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.states import JobState, LearnerState
from trainforge_services.lcm.backends.local import LocalBackend
from trainforge_services.lcm.lifecycle import LifecycleManager
from trainforge_services.lcm.lifecycle.credentials import Credentials, MonitorToken
from trainforge_services.lcm.wiring import serve as serve_lcm
from trainforge_services.trainer.lcm_client import GrpcLcm

KEY = "c" * 40
TOKEN = "s" * 40


def every_method(module, service: str) -> list[tuple[str, type]]:  # noqa: ANN001 - a generated *_pb2 module
    """(full method name, request class) of every RPC `service` declares."""
    desc = module.DESCRIPTOR.services_by_name[service]
    return [(f"/{desc.full_name}/{m.name}", message_factory.GetMessageClass(m.input_type)) for m in desc.methods]


def call_raw(address: str, method: str, request_class: type, metadata=()) -> grpc.StatusCode:  # noqa: ANN001
    """The status code of one call of `method` with an empty request."""
    with grpc.insecure_channel(address) as channel:
        stub = channel.unary_unary(method, request_serializer=request_class.SerializeToString,
                                   response_deserializer=lambda raw: raw)
        try:
            stub(request_class(), timeout=10, metadata=list(metadata))
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK


def assert_everything_refused(address: str, methods: list[tuple[str, type]]) -> None:
    assert len(methods) >= 8
    for method, request_class in methods:
        assert call_raw(address, method, request_class) == grpc.StatusCode.UNAUTHENTICATED, method
        wrong = [(rpcauth.METADATA, "Bearer " + "x" * 43)]
        assert call_raw(address, method, request_class, wrong) == grpc.StatusCode.UNAUTHENTICATED, method
    with grpc.insecure_channel(address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_every_trainer_rpc_refuses_a_caller_without_the_service_token(trainer):  # noqa: F811
    assert_everything_refused(trainer.address, every_method(trainer_pb2, "Trainer"))


def test_every_lcm_rpc_refuses_a_caller_without_the_service_token(lifecycles, lcm_settings):  # noqa: F811
    settings = lcm_settings(dev_mode=True)
    server, port = serve_lcm(settings, lifecycles())
    try:
        address = f"127.0.0.1:{port}"
        assert_everything_refused(address, every_method(lcm_pb2, "LifecycleManager"))
        # the same calls with the service token are served
        channel = rpc.channel(address, authorization=rpcauth.service_authorization(settings))
        cap = rpc.call(lcm_pb2_grpc.LifecycleManagerStub(channel).GetCapacity, lcm_pb2.GetCapacityRequest())
        assert cap.backend == "local"
        channel.close()
    finally:
        server.stop(0).wait()


@pytest.fixture
def monitor_of(trainer, tmp_path):  # noqa: F811
    """A Trainer client presenting the monitor token of one job, as the LCM grants it."""
    key = jobcreds.load_key("", dev_mode=True, state_dir=tmp_path)  # the Trainer's own (its state dir)
    channels = []

    def make(job_id: str, key: bytes = key) -> Client:
        token = jobcreds.derive(key, jobcreds.MONITOR, job_id)
        channel = rpc.channel(trainer.address,
                              authorization=rpcauth.job_authorization(jobcreds.MONITOR, job_id, token))
        channels.append(channel)
        return Client(trainer_pb2_grpc.TrainerStub(channel))

    yield make
    for channel in channels:
        channel.close()


@pytest.fixture
def service(trainer, tmp_path, mongo_server, unique, fake_lcm):  # noqa: F811
    settings = trainer_settings(mongo_server, unique, tmp_path, fake_lcm.address)
    channel = rpc.channel(trainer.address, authorization=rpcauth.service_authorization(settings))
    yield Client(trainer_pb2_grpc.TrainerStub(channel))
    channel.close()


def test_a_monitor_token_reports_for_its_own_job_only_and_not_after_it_ended(service, monitor_of, fake_lcm):  # noqa: F811
    for job in ("mine", "other"):
        service.submit(job, job_id=job)
        service.wait_state(job, JobState.DEPLOYING)
    mine = monitor_of("mine")
    running = mine.report("mine", JobState.RUNNING, learners=[learner(0, LearnerState.LEARNER_RUNNING)])
    assert running.state == JobState.RUNNING

    with pytest.raises(PermissionDenied, match="for that job only"):
        mine.report("other", JobState.RUNNING)
    with pytest.raises(PermissionDenied, match="may not call it"):
        mine.get("mine")
    with pytest.raises(PermissionDenied, match="may not call it"):
        mine.cancel("other")
    with pytest.raises(PermissionDenied, match="may not call it"):
        rpc.call(mine.stub.ListJobs, trainer_pb2.ListJobsRequest(team="t"))
    forged = monitor_of("other", key=b"k" * 32)  # a token made with another key
    with pytest.raises(Unauthenticated, match="not valid"):
        forged.report("other", JobState.RUNNING)
    assert service.get("other").state == JobState.DEPLOYING

    # the monitor finishes its job; once the Trainer has had its learners removed, the token is dead
    assert complete(mine, "mine").state == JobState.COMPLETED
    wait_for(lambda: "mine" in fake_lcm.kills, 10, "KillJob of the completed job")

    def refused() -> bool:
        try:
            mine.report("mine", JobState.COMPLETED, learners=[learner(0, LearnerState.LEARNER_COMPLETED)])
        except PermissionDenied as e:
            return "revoked" in e.message
        return False

    wait_for(refused, 10, "the finished job's monitor token to be refused")
    # the job that still runs takes its own monitor's reports
    assert monitor_of("other").report("other", JobState.RUNNING).state == JobState.RUNNING


@pytest.fixture
def granting(lcm_settings, coordinator):  # noqa: F811
    """LCM lifecycles on the local backend that grant each job its monitor token (as lcm/wiring.py builds them)."""
    def build(**kw) -> LifecycleManager:
        settings = lcm_settings(**kw)
        return LifecycleManager.from_settings(settings, LocalBackend(settings, kill_grace=5), coordinator,
                                              start_timeout=30, credentials=Credentials([MonitorToken(KEY.encode())]))

    yield from backend_maker(build)


def test_the_monitor_gets_its_own_token_and_no_job_process_gets_the_services(granting, lcm_settings, fake,  # noqa: F811
                                                                              unique):
    sizes = dict(local_cpus=4, local_memory=2**33, service_token=TOKEN, credentials_key=KEY)
    server, port = serve_lcm(lcm_settings(**sizes), granting(**sizes))
    client = GrpcLcm(f"127.0.0.1:{port}", timeout=30, authorization=f"Bearer {TOKEN}")
    job = f"j-{unique}"
    try:
        client.deploy_job(job, "team-a", 1, Manifest(name="m", learners=2, command="python train.py",
                                                     resources={"cpus": 1, "memory": "1Gi"}).model_dump_json(), "")
        runs = fake.wait_runs(3)
        by_module = {}
        for run in runs:
            by_module.setdefault(run["argv"][1], []).append(run["env"])
        (monitor,) = by_module["trainforge_services.jobmonitor"]
        assert monitor["TF_MONITOR_TOKEN"] == jobcreds.derive(KEY.encode(), jobcreds.MONITOR, job)
        for env in (monitor, *by_module["trainforge_services.controller"]):
            assert not {"TF_SERVICE_TOKEN", "TF_CREDENTIALS_KEY"} & set(env), env
            assert TOKEN not in env.values() and KEY not in env.values()
        assert all("TF_MONITOR_TOKEN" not in env for env in by_module["trainforge_services.controller"])
        assert client.kill_job(job) == 3
    finally:
        client.close()
        server.stop(0).wait()


@pytest.mark.parametrize("service", ["trainer", "lcm"])
def test_the_services_refuse_to_start_without_a_service_token_outside_dev_mode(service, mongo_server, etcd_server,
                                                                               unique, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    env.update({"TF_MONGO_URL": mongo_server.url, "TF_MONGO_DB": f"tf{unique}", "TF_STATE_DIR": str(tmp_path),
                "TF_ETCD_ENDPOINTS": etcd_server.address, "TF_ETCD_PREFIX": f"/tf-{unique}",
                "TF_TRAINER_ADDRESS": f"127.0.0.1:{free_port()}", "TF_LCM_ADDRESS": f"127.0.0.1:{free_port()}",
                "TF_SECRETS_KEY": SECRETS_KEY, "TF_CREDENTIALS_KEY": KEY})
    done = subprocess.run([sys.executable, "-m", f"trainforge_services.{service}"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "service_token (TF_SERVICE_TOKEN) is required outside dev mode" in done.stderr
    assert "Traceback" not in done.stderr

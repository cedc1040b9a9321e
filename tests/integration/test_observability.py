"""Watching the platform: Prometheus /metrics of the API, Trainer and LCM, gRPC health, JSON service logs."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.integration.lcm_local.conftest import fake, lcm_settings, lifecycles  # noqa: F401 - fixtures
from tests.integration.test_trainer_service import fake_lcm, trainer_settings  # noqa: F401 - fixtures
from tests.servers import free_port, serve_app, wait_for
from trainforge_protos import trainer_pb2, trainer_pb2_grpc
from trainforge_services.api.app import create_app
from trainforge_services.common import rpc, rpcauth
from trainforge_services.common.observability import JsonFormatter, log_context
from trainforge_services.common.settings import ApiSettings
from trainforge_services.lcm import wiring as lcm_wiring
from trainforge_services.trainer.wiring import serve as serve_trainer

pytestmark = pytest.mark.integration


def families(url: str) -> dict[str, list]:
    text = httpx.get(url, timeout=10).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def transfer_bytes(found: dict[str, list]) -> dict[str, float]:
    """trainforge_objectstore_bytes_total by direction (every service exports it)."""
    return {s.labels["direction"]: s.value for s in found["trainforge_objectstore_bytes"]
            if s.name == "trainforge_objectstore_bytes_total"}


def serving(address: str, service: str) -> bool:
    channel = rpc.channel(address)
    try:
        resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return resp.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()


def test_the_api_serves_request_metrics(mongo_db, logstore, tmp_path):
    from trainforge_services.api.identity import IdentityStore
    from trainforge_services.common.adapters.objectstore import LocalStore

    objects = LocalStore(tmp_path / "objects")
    app = create_app(ApiSettings(dev_mode=True), trainer=InMemoryTrainer(), identity=IdentityStore(mongo_db),
                     logs=logstore, objects=objects)
    with serve_app(app) as url:
        assert httpx.get(f"{url}/v1/jobs", timeout=10).status_code == 401
        before = transfer_bytes(families(f"{url}/metrics"))
        objects.put_bytes("jobs/j-0123456789ab/x", b"12345")
        assert objects.get_bytes("jobs/j-0123456789ab/x") == b"12345"
        found = families(f"{url}/metrics")
    after = transfer_bytes(found)
    assert after["put"] - before["put"] == 5 and after["get"] - before["get"] == 5
    requests = found["trainforge_http_requests"]
    assert any(s.labels == {"method": "GET", "route": "/v1/jobs", "status": "401"} for s in requests)
    assert any(s.name == "trainforge_http_request_seconds_bucket" for s in found["trainforge_http_request_seconds"])
    assert "trainforge_rpc_calls" in found


def test_the_trainer_serves_metrics_and_health(mongo_server, unique, tmp_path, fake_lcm):  # noqa: F811
    settings = trainer_settings(mongo_server, unique, tmp_path, fake_lcm.address).model_copy(
        update={"metrics_port": free_port()})
    trainer = serve_trainer(settings, collection=f"jobs_{unique}")
    try:
        channel = rpc.channel(trainer.address, authorization=rpcauth.service_authorization(settings))
        stub = trainer_pb2_grpc.TrainerStub(channel)
        # two jobs of 3 CPUs on a 4-CPU backend: one is dispatched (and stays deploying: nothing reports
        # on it), the other waits in the queue, whichever the dispatcher takes first
        for job_id in ("j-0123456789ab", "j-0123456789ac"):
            stub.SubmitJob(trainer_pb2.SubmitJobRequest(team="team-a", manifest_json=json.dumps(
                {"name": "n", "command": "true", "resources": {"cpus": 3}}), code_uri="", submitted_by="t",
                job_id=job_id), timeout=10)
        channel.close()

        def queued_one() -> dict | None:
            got = families(f"http://127.0.0.1:{trainer.metrics_port}/metrics")
            depth = [s.value for s in got["trainforge_queue_depth"] if s.labels == {"team": "team-a"}]
            return got if depth == [1] else None
        found = wait_for(queued_one, 20, "one job of team-a in the queue")
        assert any(s.labels.get("method", "").endswith("SubmitJob") and s.value >= 2
                   for s in found["trainforge_rpc_calls"])
        assert any(s.labels == {"team": "team-a", "state": "queued"} for s in found["trainforge_jobs"])
        assert set(transfer_bytes(found)) == {"put", "get"}

        def decided() -> bool:
            samples = families(f"http://127.0.0.1:{trainer.metrics_port}/metrics")["trainforge_admission_decisions"]
            return any(s.name == "trainforge_admission_decisions_total" and s.value >= 1
                       and s.labels["decision"] in ("dispatched", "held") for s in samples)
        wait_for(decided, 20, "an admission decision in /metrics")
        assert serving(trainer.address, "") and serving(trainer.address, "trainforge.Trainer")
    finally:
        trainer.stop(grace=0)


def test_the_lcm_serves_metrics_and_health(lifecycles, lcm_settings):  # noqa: F811
    port = free_port()
    sizes = dict(local_cpus=2, local_memory=2**32)
    server, grpc_port = lcm_wiring.serve(lcm_settings(**sizes).model_copy(update={"metrics_port": port, "service_token": "s" * 40}),
                                         lifecycles(**sizes))
    try:
        assert serving(f"127.0.0.1:{grpc_port}", "trainforge.LifecycleManager")
        found = families(f"http://127.0.0.1:{port}/metrics")
        assert [s.value for s in found["trainforge_lcm_running"] if s.labels == {"what": "jobs"}] == [0]
        assert "trainforge_rpc_calls" in found and "trainforge_rpc_seconds_max" in found
        assert set(transfer_bytes(found)) == {"put", "get"}
        assert found["trainforge_log_shipping_lag_lines"] == []  # no job runs (tests/unit/test_logship_lag.py)
    finally:
        lcm_wiring.ENDPOINTS.pop(grpc_port).stop()
        server.stop(0).wait()


def test_service_logs_are_json_with_their_ids():
    record = logging.LogRecord("trainforge_services.x", logging.INFO, __file__, 1, "deployed %s", ("it",), None)
    record.team = "team-a"
    with log_context(job="j-0123456789ab", request_id="r-1"):
        doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == "deployed it" and doc["level"] == "info"
    assert (doc["job"], doc["team"], doc["request_id"]) == ("j-0123456789ab", "team-a", "r-1")



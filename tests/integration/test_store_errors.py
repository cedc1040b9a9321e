"""A failing backing store reaches clients as one short sentence; the driver's details stay in the service's log.

The API is served for real, against a real Trainer (gRPC) whose MongoDB-wire
server is stopped under it, and against an identity store whose server
does not exist. Every answer is 503 with "<store> unavailable; retry
shortly" and none of pymongo's topology text (addresses, timeouts,
exception names); the log has the details.
"""

from __future__ import annotations

import logging
import signal

import httpx
import pytest

from tests import servers
from tests.integration.test_trainer_service import FakeLcm, trainer_settings
from tests.servers import serve_app
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.api.trainer_client import TrainerClient
from trainforge_services.common import rpcauth
from trainforge_services.common.adapters import mongo
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings
from trainforge_services.trainer.wiring import serve

_LEAKS = ("Topology", "ServerSelectionTimeoutError", "AutoReconnect", "Connection refused", "127.0.0.1:", "Errno")


def assert_short_503(resp: httpx.Response, message: str) -> None:
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"] == {"code": "unavailable", "message": message, "details": []}
    assert not any(leak in resp.text for leak in _LEAKS), resp.text


def test_identity_store_down_is_one_sentence(logstore, tmp_path, caplog):
    dead = mongo.connect("mongodb://127.0.0.1:9", "nowhere", timeout_ms=200)
    app = create_app(ApiSettings(dev_mode=True), trainer=_NoTrainer(), identity=IdentityStore(dead),
                     logs=logstore, objects=LocalStore(tmp_path / "o"))
    with caplog.at_level(logging.WARNING), serve_app(app) as url:
        resp = httpx.get(f"{url}/v1/jobs", headers={"Authorization": "Bearer tf_0123abcd_" + "s" * 43}, timeout=30)
        assert_short_503(resp, "identity store unavailable; retry shortly")
    assert "127.0.0.1:9" in caplog.text  # the details are in the service's log
    dead.client.close()


class _NoTrainer:
    def close(self) -> None:
        pass


@pytest.fixture
def own_mongo():
    server = servers.start_mongo()
    yield server
    server.stop(signal.SIGKILL)
    server.cleanup()


def test_job_store_down_under_a_real_trainer_is_one_sentence(own_mongo, mongo_db, logstore, tmp_path, unique, caplog):
    lcm = FakeLcm()
    settings = trainer_settings(own_mongo, unique, tmp_path, "127.0.0.1:9")
    db = mongo.connect(own_mongo.url, f"tf{unique}", timeout_ms=300)
    trainer = serve(settings, lcm=lcm, db=db)
    identity = IdentityStore(mongo_db, touch_interval=0)
    identity.create_team("alpha")
    key = identity.issue_key("alpha", "alice", Role.MEMBER)
    client = TrainerClient(trainer.address, authorization=rpcauth.service_authorization(settings))
    app = create_app(ApiSettings(dev_mode=True), trainer=client, identity=identity, logs=logstore,
                     objects=LocalStore(tmp_path / "o"))
    try:
        with caplog.at_level(logging.WARNING), serve_app(app) as url:
            h = {"Authorization": f"Bearer {key}"}
            assert httpx.get(f"{url}/v1/jobs", headers=h, timeout=30).status_code == 200
            own_mongo.stop(signal.SIGKILL)
            for path in ("/v1/jobs", "/v1/jobs/j-0123456789ab"):
                assert_short_503(httpx.get(f"{url}{path}", headers=h, timeout=30),
                                 "job store unavailable; retry shortly")
        assert "job store unavailable: ServerSelectionTimeoutError" in caplog.text
    finally:
        client.close()
        trainer.stop(0)
        db.client.close()

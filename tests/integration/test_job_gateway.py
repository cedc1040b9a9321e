"""The job gateway on real servers: the API (uvicorn on loopback), SeaweedFS's S3 and the log store.

A controller holding only its job's token and ticket (what the LCM's
GatewayIssuer grants) reads and writes what its job may, through presigned
URLs, and ships its lines; every other object, prefix and job is refused, a
ticket it widens itself is refused, and once the Trainer (the in-memory twin
here) calls the job finished its token is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.integration.test_objectstore_s3 import s3_bucket, s3_store  # noqa: F401 - a fixture
from tests.servers import serve_app, wait_for
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore
from trainforge_services.common import jobgateway
from trainforge_services.common.adapters.logstore import LogLine
from trainforge_services.common.errors import InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from trainforge_services.common.jobgateway import Ticket
from trainforge_services.common.settings import ApiSettings
from trainforge_services.controller.gatewaystore import GatewayClient, GatewayLogSink, GatewayStore

KEY = "gateway-test-key-" + "k" * 32
READS = ("datasets/pub/", "experiments/e-shared/code.tar.gz")


def client_for(url: str, job: str, team: str, reads=READS, *, key: str = KEY) -> GatewayClient:
    k = key.encode()
    return GatewayClient(url, job, jobgateway.job_token(k, job),
                         jobgateway.make_ticket(k, Ticket(job, team, tuple(reads))))


@contextlib.contextmanager
def gateway_platform(mongo_db, logstore, objects, tmp_path: Path):
    trainer = InMemoryTrainer()
    for team, job in (("alpha", "j-alpha000001"), ("beta", "j-beta0000001")):
        trainer.submit_job(team=team, manifest_json='{"name": "g", "framework": "custom", "command": "true"}',
                           code_uri="", submitted_by="u", job_id=job)
    settings = ApiSettings(dev_mode=True, state_dir=tmp_path / "api-state", credentials_key=KEY,
                           retention_interval=0)
    app = create_app(settings, trainer=trainer, identity=IdentityStore(mongo_db, touch_interval=0), logs=logstore,
                     objects=objects)
    with serve_app(app) as url:
        yield SimpleNamespace(url=url, trainer=trainer, objects=objects, a="j-alpha000001", b="j-beta0000001")


@pytest.fixture
def gw(request, mongo_db, logstore, tmp_path, unique):
    request.getfixturevalue("s3_bucket")
    objects = s3_store(request.getfixturevalue("s3_server"), f"t-{unique}")
    with gateway_platform(mongo_db, logstore, objects, tmp_path) as p:
        for key, data in {f"jobs/{p.a}/code.tar.gz": b"code-a", f"jobs/{p.b}/outputs/0/secret.txt": b"beta's",
                          "datasets/pub/x.txt": b"public", "datasets/pub-private/y.txt": b"private",
                          "experiments/e-shared/code.tar.gz": b"exp code", "experiments/e-other/code.tar.gz": b"o"
                          }.items():
            objects.put_bytes(key, data)
        p.store = GatewayStore(client_for(p.url, p.a, "alpha"))
        yield p
        p.store.close()
    objects.close()


def test_a_job_reads_and_writes_its_own_objects_and_what_it_was_granted(gw, tmp_path):
    store, a = gw.store, gw.a
    big = tmp_path / "model.bin"
    big.write_bytes(os.urandom(3 * 2**20 + 17))
    info = store.put_file(f"jobs/{a}/outputs/0/model.bin", big)
    assert info.sha256 == hashlib.sha256(big.read_bytes()).hexdigest()
    # the platform's own view agrees: the object and its recorded SHA-256 are in the store
    assert gw.objects.info(f"jobs/{a}/outputs/0/model.bin") == info
    store.get_file(f"jobs/{a}/outputs/0/model.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == big.read_bytes()
    assert store.get_bytes(f"jobs/{a}/code.tar.gz") == b"code-a"
    assert store.get_bytes("datasets/pub/x.txt") == b"public"
    assert store.get_bytes("experiments/e-shared/code.tar.gz") == b"exp code"
    assert b"".join(store.iter_bytes("datasets/pub/x.txt")) == b"public"
    assert [o.key for o in store.list("datasets/pub")] == ["datasets/pub/x.txt"]
    assert store.exists(f"jobs/{a}/code.tar.gz") and not store.exists(f"jobs/{a}/nothing")
    with pytest.raises(NotFound):
        store.get_bytes(f"jobs/{a}/outputs/0/missing")
    store.put_bytes(f"jobs/{a}/checkpoints/0/000000000001/w.pt", b"w")
    assert store.delete_prefix(f"jobs/{a}/checkpoints/0/") == 1
    assert not gw.objects.list(f"jobs/{a}/checkpoints/")


@pytest.mark.parametrize("key", ["jobs/j-beta0000001/outputs/0/secret.txt", "jobs/j-beta0000001", "jobs",
                                 "datasets/pub-private/y.txt", "experiments/e-other/code.tar.gz", "datasets"])
def test_another_jobs_or_teams_objects_are_neither_listed_nor_read(gw, key, tmp_path):
    for call in (lambda: gw.store.list(key), lambda: gw.store.get_bytes(key), lambda: gw.store.info(key),
                 lambda: gw.store.get_file(key, tmp_path / "stolen")):
        with pytest.raises(PermissionDenied, match="may not read"):
            call()
    assert not (tmp_path / "stolen").exists()


@pytest.mark.parametrize("key", ["jobs/j-beta0000001/outputs/0/x", "jobs/j-alpha000001/code.tar.gz",
                                 "jobs/j-alpha000001/outputs", "datasets/pub/x.txt", "elsewhere/x"])
def test_nothing_is_written_or_deleted_outside_the_jobs_own_prefixes(gw, key):
    with pytest.raises(PermissionDenied, match="may not write"):
        gw.store.put_bytes(key, b"overwritten")
    with pytest.raises(PermissionDenied, match="may not write"):
        gw.store.delete_prefix(key)
    with pytest.raises(InvalidArgument):
        gw.store.put_bytes("jobs/j-alpha000001/outputs/../../j-beta0000001/outputs/0/x", b"x")
    assert gw.objects.get_bytes(f"jobs/{gw.b}/outputs/0/secret.txt") == b"beta's"
    assert gw.objects.get_bytes("datasets/pub/x.txt") == b"public"


def test_a_presigned_put_stores_only_the_sha256_it_was_signed_for(gw):
    client = client_for(gw.url, gw.a, "alpha")
    doc = client.call("objects/write", {"key": f"jobs/{gw.a}/outputs/0/f", "sha256": "a" * 64})
    forged = httpx.put(doc["url"], content=b"other", headers={"x-amz-meta-sha256": "b" * 64})
    assert forged.status_code == 403, forged.text
    assert not gw.objects.exists(f"jobs/{gw.a}/outputs/0/f")
    client.close()


def test_a_token_or_ticket_not_issued_to_the_job_is_refused(gw):
    k = KEY.encode()
    a, b = gw.a, gw.b
    cases = {
        "another job's token": GatewayClient(gw.url, a, jobgateway.job_token(k, b),
                                             jobgateway.make_ticket(k, Ticket(a, "alpha", READS))),
        "another job's ticket": GatewayClient(gw.url, a, jobgateway.job_token(k, a),
                                              jobgateway.make_ticket(k, Ticket(b, "beta", ()))),
        "a ticket it widened itself": client_for(gw.url, a, "alpha", ("jobs/",), key="not-the-key-" + "x" * 32),
        "a wrong token": GatewayClient(gw.url, a, "x" * 43, jobgateway.make_ticket(k, Ticket(a, "alpha", READS))),
    }
    for what, client in cases.items():
        store = GatewayStore(client)
        with pytest.raises(Unauthenticated, match="token|ticket"):
            store.list(f"jobs/{a}/")
        store.close()
        assert what
    # a ticket naming another team than the job's: the Trainer knows no such job of that team
    liar = GatewayStore(client_for(gw.url, a, "beta", ("jobs/",)))
    with pytest.raises(PermissionDenied, match="not a job of team beta"):
        liar.list(f"jobs/{b}/")
    liar.close()
    # the job's token opens none of the API's own routes
    resp = httpx.get(f"{gw.url}/v1/jobs/{a}/logs", headers={"Authorization": f"Bearer {jobgateway.job_token(k, a)}"})
    assert resp.status_code == 401, resp.text


def line(job: str, team: str, seq: int, text: str) -> bytes:
    doc = LogLine(job=job, team=team, learner=0, attempt=1, stream="stdout", seq=seq, ts="2026-01-01T00:00:00.000Z",
                  line=text).to_doc()
    return json.dumps(doc).encode()


def test_lines_are_written_for_the_job_only_and_none_are_read_back(gw, logstore):
    client = client_for(gw.url, gw.a, "alpha")
    sink = GatewayLogSink(client, "log")
    sink.write_raw([(f"{gw.a}.0.1.{i}", line(gw.a, "alpha", i, f"line {i}")) for i in range(1, 501)])
    logstore.refresh()
    assert logstore.count(gw.a) == 500
    for bad in ([line(gw.b, "beta", 1, "forged")], [line(gw.a, "beta", 501, "wrong team")],
                [line(gw.a, "alpha", 502, "fine"), line(gw.b, "alpha", 1, "one bad line")]):
        with pytest.raises(PermissionDenied, match="writes only"):
            sink.write_raw([("x", raw) for raw in bad])
    with pytest.raises(InvalidArgument):
        sink.write_raw([("x", b'{"job": "%s", "extra": 1}' % gw.a.encode())])
    logstore.refresh()
    assert logstore.count(gw.b) == 0 and logstore.count(gw.a) == 500
    # no route reads lines back with the job's credentials
    for method in ("GET", "POST"):
        resp = httpx.request(method, f"{client.base}/logs", headers=dict(client._http.headers))
        assert resp.status_code in (404, 405), resp.text
    client.close()


def test_a_finished_jobs_token_is_refused(gw):
    gw.store.list(f"jobs/{gw.a}/")
    gw.trainer.cancel_job("alpha", gw.a, actor="test")

    def refused() -> bool:
        try:
            gw.store.list(f"jobs/{gw.a}/")
        except PermissionDenied as e:
            return "cancelled" in e.message
        return False

    wait_for(refused, 10, "the cancelled job's token to be refused")
    client = client_for(gw.url, gw.a, "alpha")
    with pytest.raises(PermissionDenied, match="no longer accepted"):
        GatewayLogSink(client, "log").write_raw([("x", line(gw.a, "alpha", 1, "late"))])
    client.close()

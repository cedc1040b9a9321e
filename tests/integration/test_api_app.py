"""The REST API's routes against real MongoDB-wire (identity) and log search servers.

The Trainer is the in-memory twin, so these tests pin the API's own
behaviour: authentication, validation listing every bad field, team
scoping, the code upload, log pagination, and one error body shape.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from types import SimpleNamespace

import httpx
import pytest

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.servers import serve_app
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role, key_id_of
from trainforge_services.common.adapters.logstore import LogLine
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.common.settings import ApiSettings
from trainforge_services.common.states import JobState

MANIFEST = """
name: mnist
framework: torch
learners: 2
resources: {cpus: 1, memory: 1Gi}
command: python train.py --epochs {{epochs}}
params: {epochs: 2}
code: ./src
"""


def targz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def api(mongo_db, logstore, tmp_path):
    identity = IdentityStore(mongo_db, touch_interval=0)
    identity.create_team("alpha")
    identity.create_team("beta")
    key_a = identity.issue_key("alpha", "alice", Role.MEMBER)
    key_b = identity.issue_key("beta", "bob", Role.MEMBER)
    trainer = InMemoryTrainer()
    objects = LocalStore(tmp_path / "objects")
    settings = ApiSettings(dev_mode=True, max_upload_bytes=4096, log_page_max=1000)
    app = create_app(settings, trainer=trainer, identity=identity, logs=logstore, objects=objects)
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield SimpleNamespace(client=client, trainer=trainer, objects=objects, identity=identity, logs=logstore,
                              key_a=key_a, key_b=key_b, a={"Authorization": f"Bearer {key_a}"},
                              b={"Authorization": f"Bearer {key_b}"})


def assert_error_shape(resp, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    for d in body["error"]["details"]:
        assert set(d) == {"field", "message"}
    return body["error"]


def submit(api, headers=None, manifest=MANIFEST, code: bytes | None = None, **kw):
    files = {"code": ("code.tar.gz", code, "application/gzip")} if code is not None else None
    return api.client.post("/v1/jobs", data={"manifest": manifest}, files=files,
                           headers=headers if headers is not None else api.a, **kw)


@pytest.mark.parametrize("header", [None, "Bearer", "Basic dXNlcjpwYXNz", "Bearer not-a-key",
                                    "Bearer tf_00000000_" + "x" * 43])
def test_requests_without_a_valid_key_get_401(api, header):
    headers = {"Authorization": header} if header else {}
    for method, path in (("GET", "/v1/jobs"), ("GET", "/v1/jobs/j-000000000000"), ("POST", "/v1/jobs/j-1/cancel")):
        resp = api.client.request(method, path, headers=headers)
        assert_error_shape(resp, 401, "unauthenticated")
        assert resp.headers["www-authenticate"] == "Bearer"


def test_wrong_secret_and_revoked_key_get_401(api):
    key_id = key_id_of(api.key_a)
    forged = api.key_a[:-4] + ("AAAA" if not api.key_a.endswith("AAAA") else "BBBB")
    assert_error_shape(api.client.get("/v1/jobs", headers={"Authorization": f"Bearer {forged}"}), 401,
                       "unauthenticated")
    assert api.client.get("/v1/jobs", headers=api.a).status_code == 200
    api.identity.revoke_key(key_id)
    err = assert_error_shape(api.client.get("/v1/jobs", headers=api.a), 401, "unauthenticated")
    assert "revoked" in err["message"]


def test_submit_stores_code_and_passes_the_manifest(api):
    archive = targz({"train.py": b"print('hi')\n", "pkg/util.py": b"X = 1\n"})
    resp = submit(api, code=archive)
    assert resp.status_code == 201, resp.text
    job = resp.json()
    assert re.fullmatch(r"j-[0-9a-f]{12}", job["id"])
    assert job["team"] == "alpha" and job["name"] == "mnist" and job["state"] == "queued"
    assert [h["to"] for h in job["history"]] == ["pending", "queued"]
    assert api.objects.get_bytes(f"jobs/{job['id']}/code.tar.gz") == archive
    (sub,) = api.trainer.submissions
    assert sub == {"team": "alpha", "job_id": job["id"], "code_uri": f"store://jobs/{job['id']}/code.tar.gz",
                   "submitted_by": key_id_of(api.key_a),
                   "manifest_json": parse_manifest(MANIFEST).model_dump_json()}
    assert job["manifest"]["resources"]["memory"] == 2**30
    # the job is visible to its team, listed, and invisible to others
    assert api.client.get(f"/v1/jobs/{job['id']}", headers=api.a).json()["id"] == job["id"]
    assert [j["id"] for j in api.client.get("/v1/jobs", headers=api.a).json()["jobs"]] == [job["id"]]
    assert api.client.get("/v1/jobs", headers=api.b).json()["jobs"] == []


def test_submit_without_code_passes_an_empty_code_uri(api):
    resp = submit(api, manifest=json.dumps({"name": "tiny", "framework": "custom", "command": "true"}))
    assert resp.status_code == 201, resp.text
    assert api.trainer.submissions[0]["code_uri"] == ""
    assert api.objects.list("jobs/") == []


def test_bad_manifest_gets_422_naming_every_field(api):
    resp = submit(api, manifest="name: Bad_Name\nlearners: 0\nresources: {memory: lots}\nbogus: 1\n")
    err = assert_error_shape(resp, 422, "invalid_argument")
    fields = {d["field"] for d in err["details"]}
    assert fields == {"name", "learners", "resources.memory", "command", "bogus"}
    for field in fields:
        assert field in err["message"]
    assert api.trainer.submissions == []


@pytest.mark.parametrize("manifest", ["{not yaml: [", "- a list\n- not a mapping\n", ""])
def test_unparseable_manifest_gets_422(api, manifest):
    err = assert_error_shape(submit(api, manifest=manifest), 422, "invalid_argument")
    assert [d["field"] for d in err["details"]] == ["manifest"]


def test_missing_manifest_field_is_named(api):
    resp = api.client.post("/v1/jobs", files={"code": ("c.tgz", targz({"a": b"1"}), "application/gzip")},
                           headers=api.a)
    err = assert_error_shape(resp, 422, "invalid_argument")
    assert [d["field"] for d in err["details"]] == ["manifest"]


def test_code_that_is_not_a_targz_is_rejected_before_anything_is_stored(api):
    err = assert_error_shape(submit(api, code=b"PK\x03\x04 this is a zip"), 422, "invalid_argument")
    assert err["message"] == "code: not a tar.gz archive"
    assert err["details"] == [{"field": "code", "message": "not a tar.gz archive"}]
    truncated = targz({"train.py": b"x" * 3000})[:-20]
    assert_error_shape(submit(api, code=truncated), 422, "invalid_argument")
    escaping = targz({"../evil.py": b"1"})
    assert "outside" in assert_error_shape(submit(api, code=escaping), 422, "invalid_argument")["message"]
    assert api.objects.list("jobs/") == [] and api.trainer.submissions == []


def test_oversized_code_gets_413(api):
    import os

    big = targz({"blob.bin": os.urandom(8192)})  # incompressible, over the 4096-byte limit
    assert_error_shape(submit(api, code=big), 413, "payload_too_large")
    # a body declared far over the limit is refused before it is read
    huge = b"\0" * (2 << 20)
    assert_error_shape(submit(api, code=huge), 413, "payload_too_large")
    assert api.objects.list("jobs/") == [] and api.trainer.submissions == []


def test_idempotency_key_returns_the_first_job(api):
    first = submit(api, headers={**api.a, "Idempotency-Key": "retry-1"})
    assert first.status_code == 201
    again = submit(api, headers={**api.a, "Idempotency-Key": "retry-1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert len(api.trainer.submissions) == 1
    # the same key from another team is another job
    other = submit(api, headers={**api.b, "Idempotency-Key": "retry-1"})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    changed = submit(api, headers={**api.a, "Idempotency-Key": "retry-1"}, manifest=MANIFEST.replace("2}", "3}"))
    assert_error_shape(changed, 409, "conflict")


def test_unknown_and_other_teams_job_are_the_same_404(api):
    job_id = submit(api).json()["id"]
    missing = "j-ffffffffffff"
    for path in ("/v1/jobs/{}", "/v1/jobs/{}/logs"):
        theirs = api.client.get(path.format(job_id), headers=api.b)
        nothing = api.client.get(path.format(missing), headers=api.b)
        e1, e2 = assert_error_shape(theirs, 404, "not_found"), assert_error_shape(nothing, 404, "not_found")
        assert e1["message"].replace(job_id, "ID") == e2["message"].replace(missing, "ID")
    assert_error_shape(api.client.post(f"/v1/jobs/{job_id}/cancel", headers=api.b), 404, "not_found")
    assert api.client.get(f"/v1/jobs/{job_id}", headers=api.a).json()["state"] == "queued"


def test_cancel_records_the_caller(api):
    job_id = submit(api).json()["id"]
    resp = api.client.post(f"/v1/jobs/{job_id}/cancel", headers=api.a)
    assert resp.status_code == 200
    job = resp.json()
    assert job["state"] == "cancelled"
    assert job["history"][-1]["actor"] == f"user:{key_id_of(api.key_a)}"
    assert api.client.post(f"/v1/jobs/{job_id}/cancel", headers=api.a).json()["state"] == "cancelled"


def test_halt_and_resume_through_the_routes(api):
    job_id = submit(api).json()["id"]
    err = assert_error_shape(api.client.post(f"/v1/jobs/{job_id}/halt", headers=api.a), 409, "conflict")
    assert "queued" in err["message"]
    assert_error_shape(api.client.post(f"/v1/jobs/{job_id}/resume", headers=api.a), 409, "conflict")
    assert_error_shape(api.client.post("/v1/jobs/j-000000000000/halt", headers=api.a), 404, "not_found")
    assert_error_shape(api.client.post(f"/v1/jobs/{job_id}/halt", headers=api.b), 404, "not_found")
    api.trainer.report(job_id, JobState.DEPLOYING, "dispatched", actor="trainer")
    api.trainer.report(job_id, JobState.RUNNING, "every learner started")
    halted = api.client.post(f"/v1/jobs/{job_id}/halt", headers=api.a).json()
    assert halted["state"] == "halted"
    assert [h["to"] for h in halted["history"][-2:]] == ["halting", "halted"]
    assert halted["history"][-2]["actor"] == f"user:{key_id_of(api.key_a)}"
    resumed = api.client.post(f"/v1/jobs/{job_id}/resume", headers=api.a).json()
    assert (resumed["state"], resumed["attempt"]) == ("queued", halted["attempt"] + 1)
    assert {"restarts", "checkpoint_step", "not_before"} <= set(resumed)


def test_list_filters_by_state_and_rejects_unknown_states(api):
    ids = [submit(api).json()["id"] for _ in range(3)]
    api.trainer.report(ids[0], JobState.DEPLOYING, "dispatched", actor="trainer")
    api.trainer.report(ids[0], JobState.RUNNING, "every learner started")
    api.client.post(f"/v1/jobs/{ids[1]}/cancel", headers=api.a)

    def listed(query):
        return [j["id"] for j in api.client.get(f"/v1/jobs{query}", headers=api.a).json()["jobs"]]

    assert listed("") == ids[::-1]
    assert listed("?state=running") == [ids[0]]
    assert set(listed("?state=running,cancelled")) == {ids[0], ids[1]}
    assert set(listed("?state=RUNNING&state=queued")) == {ids[0], ids[2]}
    assert listed("?limit=1") == [ids[2]]
    err = assert_error_shape(api.client.get("/v1/jobs?state=sleeping", headers=api.a), 422, "invalid_argument")
    assert err["details"][0]["field"] == "state"


def test_query_validation_lists_every_bad_parameter(api):
    job_id = submit(api).json()["id"]
    resp = api.client.get(f"/v1/jobs/{job_id}/logs?learner=-1&limit=0", headers=api.a)
    err = assert_error_shape(resp, 422, "invalid_argument")
    assert {d["field"] for d in err["details"]} == {"learner", "limit"}


def _ship(logs, job, team, learner, attempt, seqs, second0=0):
    logs.write([LogLine(job, team, learner, attempt, "stdout", s,
                        f"2030-01-01T00:{(second0 + s) // 60:02d}:{(second0 + s) % 60:02d}.000Z",
                        f"learner {learner} line {s}") for s in seqs], refresh=True)


def test_logs_paginate_with_a_cursor_and_stay_in_order(api):
    job_id = submit(api).json()["id"]
    _ship(api.logs, job_id, "alpha", 0, 1, range(1, 8))
    _ship(api.logs, job_id, "alpha", 1, 1, range(1, 6))
    _ship(api.logs, job_id, "beta", 2, 1, range(1, 4))  # lines filed under another team are never shown
    pages, after = [], None
    while True:
        params = {"limit": 4, **({"after": after} if after else {})}
        page = api.client.get(f"/v1/jobs/{job_id}/logs", params=params, headers=api.a).json()
        assert page["job_state"] == "queued"
        if not page["lines"]:
            assert page["next"] == after
            break
        assert re.fullmatch(r"\d+:\d+=\d+(,\d+:\d+=\d+)*", page["next"])
        pages.append(page["lines"])
        after = page["next"]
    assert len(pages) == 3 and all(len(p) <= 4 for p in pages)
    lines = [ln for p in pages for ln in p]
    for learner, count in ((0, 7), (1, 5)):
        assert [ln["seq"] for ln in lines if ln["learner"] == learner] == list(range(1, count + 1))
    assert {ln["team"] for ln in lines} == {"alpha"}
    assert after == "0:1=7,1:1=5"
    # a line shipped late continues its stream after the cursor
    _ship(api.logs, job_id, "alpha", 1, 1, [6])
    page = api.client.get(f"/v1/jobs/{job_id}/logs", params={"after": after}, headers=api.a).json()
    assert [(ln["learner"], ln["seq"]) for ln in page["lines"]] == [(1, 6)]
    assert page["next"] == "0:1=7,1:1=6"
    only1 = api.client.get(f"/v1/jobs/{job_id}/logs", params={"learner": 1}, headers=api.a).json()["lines"]
    assert [ln["seq"] for ln in only1] == [1, 2, 3, 4, 5, 6] and {ln["learner"] for ln in only1} == {1}


def test_a_bad_cursor_is_named(api):
    job_id = submit(api).json()["id"]
    resp = api.client.get(f"/v1/jobs/{job_id}/logs", params={"after": "garbage"}, headers=api.a)
    err = assert_error_shape(resp, 422, "invalid_argument")
    assert err["details"][0]["field"] == "after"


def test_logs_full_text_query(api):
    job_id = submit(api).json()["id"]
    _ship(api.logs, job_id, "alpha", 0, 1, range(1, 6))
    api.logs.write([LogLine(job_id, "alpha", 0, 1, "stdout", 6, "2030-01-01T00:01:00.000Z", "test accuracy 0.98")],
                   refresh=True)
    page = api.client.get(f"/v1/jobs/{job_id}/logs", params={"q": "accuracy"}, headers=api.a).json()
    assert [ln["line"] for ln in page["lines"]] == ["test accuracy 0.98"]


def test_unexpected_errors_are_a_bare_500(api, caplog):
    def boom(team, job_id):
        raise RuntimeError("secret internals at /etc/passwd")

    api.trainer.get_job = boom
    resp = api.client.get("/v1/jobs/j-1", headers=api.a)
    err = assert_error_shape(resp, 500, "internal")
    assert err["message"] == "internal error"
    assert "secret" not in resp.text and "Traceback" not in resp.text
    assert any(r.exc_info and "secret internals" in str(r.exc_info[1]) for r in caplog.records)


def test_unknown_route_uses_the_same_error_shape(api):
    assert_error_shape(api.client.get("/v2/nothing", headers=api.a), 404, "not_found")
    assert_error_shape(api.client.delete("/v1/jobs", headers=api.a), 405, "method_not_allowed")


def test_healthz_reports_each_component(api):
    resp = api.client.get("/healthz")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok", "components": {
        "trainer": {"status": "ok", "detail": ""}, "mongo": {"status": "ok", "detail": ""},
        "logstore": {"status": "ok", "detail": ""}}}

    def down():
        raise Unavailable("service unavailable: trainer is not listening")

    api.trainer.health = down
    resp = api.client.get("/healthz")
    assert resp.status_code == 503
    body = resp.json()
    assert body["status"] == "unavailable"
    assert body["components"]["trainer"] == {"status": "unavailable",
                                             "detail": "service unavailable: trainer is not listening"}
    assert body["components"]["mongo"]["status"] == "ok"


def test_openapi_documents_the_routes(api):
    assert api.client.get("/docs").status_code == 200
    spec = api.client.get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/logs", "/v1/jobs/{job_id}/cancel",
            "/healthz"} <= set(spec["paths"])
    post = spec["paths"]["/v1/jobs"]["post"]
    assert post["description"] and {"201", "401", "413", "422"} <= set(post["responses"])

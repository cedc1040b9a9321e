"""Teams, roles, keys, quotas, usage, the audit log and rate limits over REST.

Identity and the audit log live in the real MongoDB-wire server; the
Trainer is the in-memory twin. `make_platform` builds the app with three
teams — alpha and beta (a member and a team admin each) and ops (a platform
admin) — and is shared by the other multi-tenancy test files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from types import SimpleNamespace

import httpx
import pytest
from fastapi import APIRouter

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.integration.test_api_app import assert_error_shape
from tests.servers import serve_app
from trainforge_services.api.app import create_app
from trainforge_services.api.deps import TenantDep
from trainforge_services.api.identity import IdentityStore, Role, key_id_of
from trainforge_services.api.ratelimit import RateLimiter
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings

JOB = json.dumps({"name": "tiny", "framework": "custom", "command": "true", "learners": 2,
                  "resources": {"gpus": 1, "cpus": 2, "memory": "1Gi", "gpu_type": "a100"}})


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextlib.contextmanager
def make_platform(mongo_db, logstore, tmp_path, *, limiter: RateLimiter | None = None, experiments=None,  # noqa: ANN001
                  **settings):
    identity = IdentityStore(mongo_db, touch_interval=0)
    keys = {}
    for team in ("alpha", "beta", "ops"):
        identity.create_team(team)
    for team in ("alpha", "beta"):
        keys[f"{team}_member"] = identity.issue_key(team, f"{team}-member", Role.MEMBER)
        keys[f"{team}_admin"] = identity.issue_key(team, f"{team}-admin", Role.TEAM_ADMIN)
    keys["platform"] = identity.issue_key("ops", "root", Role.PLATFORM_ADMIN)
    trainer = InMemoryTrainer()
    app = create_app(ApiSettings(dev_mode=True, **settings), trainer=trainer, identity=identity, logs=logstore,
                     objects=LocalStore(tmp_path / "objects"), limiter=limiter, experiments=experiments)
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield SimpleNamespace(client=client, app=app, identity=identity, trainer=trainer, db=mongo_db,
                              keys=keys, h={name: bearer(key) for name, key in keys.items()})


@pytest.fixture
def p(mongo_db, logstore, tmp_path):
    with make_platform(mongo_db, logstore, tmp_path) as platform:
        yield platform


def submit(p, who: str, manifest: str = JOB) -> dict:
    resp = p.client.post("/v1/jobs", data={"manifest": manifest}, headers=p.h[who])
    assert resp.status_code == 201, resp.text
    return resp.json()


# -- roles -------------------------------------------------------------------------------------


def test_members_get_403_on_admin_and_team_admin_routes(p):
    admin_only = [("GET", "/v1/admin/teams"), ("POST", "/v1/admin/teams"), ("GET", "/v1/admin/usage"),
                  ("PUT", "/v1/admin/teams/alpha/quota"), ("GET", "/v1/admin/audit"),
                  ("POST", "/v1/admin/teams/beta/disable"), ("DELETE", "/v1/admin/keys/00000000")]
    team_admin = [("GET", "/v1/team/keys"), ("POST", "/v1/team/keys"), ("DELETE", "/v1/team/keys/00000000")]
    for method, path in admin_only + team_admin:
        err = assert_error_shape(p.client.request(method, path, headers=p.h["alpha_member"], json={}), 403,
                                 "permission_denied")
        assert "admin" in err["message"]
    for method, path in admin_only:
        assert_error_shape(p.client.request(method, path, headers=p.h["alpha_admin"], json={}), 403,
                           "permission_denied")
    assert p.client.get("/v1/team/keys", headers=p.h["alpha_admin"]).status_code == 200
    assert p.client.get("/v1/admin/teams", headers=p.h["platform"]).status_code == 200


def test_whoami_names_team_role_and_key(p):
    me = p.client.get("/v1/auth/me", headers=p.h["beta_admin"]).json()
    assert me == {"team": "beta", "key_id": key_id_of(p.keys["beta_admin"]), "role": "team_admin", "via": "key"}


# -- the team's keys -------------------------------------------------------------------------------


def test_team_admins_issue_list_and_revoke_their_teams_keys(p):
    resp = p.client.post("/v1/team/keys", json={"name": "ci"}, headers=p.h["alpha_admin"])
    assert resp.status_code == 201, resp.text
    issued = resp.json()
    assert issued["team"] == "alpha" and issued["role"] == "member" and issued["name"] == "ci"
    assert issued["key"].startswith(f"tf_{issued['key_id']}_")
    assert issued["created_by"] == key_id_of(p.keys["alpha_admin"])
    assert p.client.get("/v1/jobs", headers=bearer(issued["key"])).status_code == 200

    listed = p.client.get("/v1/team/keys", headers=p.h["alpha_admin"]).json()["keys"]
    assert {k["name"] for k in listed} == {"alpha-member", "alpha-admin", "ci"}
    assert all("key" not in k and "hash" not in k for k in listed)
    used = next(k for k in listed if k["key_id"] == issued["key_id"])
    assert used["last_used_at"] is not None and used["created_at"] <= used["last_used_at"]

    revoked = p.client.delete(f"/v1/team/keys/{issued['key_id']}", headers=p.h["alpha_admin"]).json()
    assert revoked["revoked"] is True and revoked["revoked_at"] is not None
    # effective on the very next request
    err = assert_error_shape(p.client.get("/v1/jobs", headers=bearer(issued["key"])), 401, "unauthenticated")
    assert "revoked" in err["message"]


def test_a_key_is_never_stronger_than_its_issuer(p):
    err = assert_error_shape(p.client.post("/v1/team/keys", json={"name": "x", "role": "platform_admin"},
                                           headers=p.h["alpha_admin"]), 403, "permission_denied")
    assert "platform_admin" in err["message"]
    ok = p.client.post("/v1/team/keys", json={"name": "co-admin", "role": "team_admin"}, headers=p.h["alpha_admin"])
    assert ok.status_code == 201 and ok.json()["role"] == "team_admin"


def test_key_input_is_validated_field_by_field(p):
    resp = p.client.post("/v1/team/keys", json={"name": "", "role": "root", "colour": "red"},
                         headers=p.h["alpha_admin"])
    err = assert_error_shape(resp, 422, "invalid_argument")
    assert {d["field"] for d in err["details"]} == {"name", "role", "colour"}
    past = p.client.post("/v1/team/keys", json={"name": "old", "expires_at": "2001-01-01T00:00:00Z"},
                         headers=p.h["alpha_admin"])
    assert assert_error_shape(past, 422, "invalid_argument")["details"][0]["field"] == "expires_at"


def test_expired_keys_get_401(p):
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    issued = p.client.post("/v1/team/keys", json={"name": "temp", "expires_at": soon},
                           headers=p.h["alpha_admin"]).json()
    assert abs(issued["expires_at"] - (time.time() + 3600)) < 60
    assert p.client.get("/v1/jobs", headers=bearer(issued["key"])).status_code == 200
    p.db["api_keys"].update_one({"_id": issued["key_id"]}, {"$set": {"expires_at": time.time() - 1}})
    err = assert_error_shape(p.client.get("/v1/jobs", headers=bearer(issued["key"])), 401, "unauthenticated")
    assert "expired" in err["message"]


def test_another_teams_key_is_404_like_a_missing_one(p):
    theirs = key_id_of(p.keys["beta_member"])
    e1 = assert_error_shape(p.client.delete(f"/v1/team/keys/{theirs}", headers=p.h["alpha_admin"]), 404, "not_found")
    e2 = assert_error_shape(p.client.delete("/v1/team/keys/0badf00d", headers=p.h["alpha_admin"]), 404, "not_found")
    assert e1["message"].replace(theirs, "ID") == e2["message"].replace("0badf00d", "ID")
    assert p.client.get("/v1/jobs", headers=p.h["beta_member"]).status_code == 200


def test_a_team_admin_cannot_revoke_a_stronger_key_of_their_team(p):
    ops_admin = bearer(p.identity.issue_key("ops", "ops-admin", Role.TEAM_ADMIN))
    root = key_id_of(p.keys["platform"])
    err = assert_error_shape(p.client.delete(f"/v1/team/keys/{root}", headers=ops_admin), 403, "permission_denied")
    assert "platform_admin" in err["message"]
    assert p.client.get("/v1/admin/teams", headers=p.h["platform"]).status_code == 200
    # an equal role may be revoked
    peer = p.identity.create_key("ops", "peer", Role.TEAM_ADMIN)[1]["key_id"]
    assert p.client.delete(f"/v1/team/keys/{peer}", headers=ops_admin).json()["revoked"] is True


def test_platform_admins_manage_any_teams_keys(p):
    issued = p.client.post("/v1/admin/teams/beta/keys", json={"name": "robot", "role": "team_admin"},
                           headers=p.h["platform"])
    assert issued.status_code == 201 and issued.json()["team"] == "beta"
    keys = p.client.get("/v1/admin/teams/beta/keys", headers=p.h["platform"]).json()["keys"]
    assert "robot" in {k["name"] for k in keys}
    victim = key_id_of(p.keys["beta_member"])
    assert p.client.delete(f"/v1/admin/keys/{victim}", headers=p.h["platform"]).json()["revoked"] is True
    assert p.client.get("/v1/jobs", headers=p.h["beta_member"]).status_code == 401
    assert_error_shape(p.client.get("/v1/admin/teams/nobody/keys", headers=p.h["platform"]), 404, "not_found")
    assert_error_shape(p.client.delete("/v1/admin/keys/0badf00d", headers=p.h["platform"]), 404, "not_found")


# -- teams -----------------------------------------------------------------------------------------


def test_platform_admins_create_list_and_disable_teams(p):
    created = p.client.post("/v1/admin/teams", json={"name": "gamma"}, headers=p.h["platform"])
    assert created.status_code == 201 and created.json()["name"] == "gamma" and not created.json()["disabled"]
    assert_error_shape(p.client.post("/v1/admin/teams", json={"name": "gamma"}, headers=p.h["platform"]), 409,
                       "conflict")
    bad = p.client.post("/v1/admin/teams", json={"name": "Not Valid"}, headers=p.h["platform"])
    assert assert_error_shape(bad, 422, "invalid_argument")["details"][0]["field"] == "name"
    names = [t["name"] for t in p.client.get("/v1/admin/teams", headers=p.h["platform"]).json()["teams"]]
    assert names == ["alpha", "beta", "gamma", "ops"]

    job = submit(p, "alpha_member")
    disabled = p.client.post("/v1/admin/teams/alpha/disable", headers=p.h["platform"]).json()
    assert disabled["disabled"] is True and disabled["disabled_at"] is not None
    # every key of a disabled team: 401, on every route, from the next request on
    for who in ("alpha_member", "alpha_admin"):
        for method, path in (("GET", "/v1/jobs"), ("GET", f"/v1/jobs/{job['id']}"), ("GET", "/v1/team/usage"),
                             ("POST", "/v1/auth/token")):
            err = assert_error_shape(p.client.request(method, path, headers=p.h[who]), 401, "unauthenticated")
            assert "disabled" in err["message"]
    assert p.client.get("/v1/jobs", headers=p.h["beta_member"]).status_code == 200
    assert_error_shape(p.client.post("/v1/admin/teams/alpha/keys", json={"name": "x"}, headers=p.h["platform"]),
                       409, "conflict")
    assert p.client.post("/v1/admin/teams/alpha/enable", headers=p.h["platform"]).json()["disabled"] is False
    assert p.client.get(f"/v1/jobs/{job['id']}", headers=p.h["alpha_member"]).status_code == 200


def test_a_platform_admin_cannot_lock_out_their_own_team(p):
    assert_error_shape(p.client.post("/v1/admin/teams/ops/disable", headers=p.h["platform"]), 409, "conflict")
    assert_error_shape(p.client.post("/v1/admin/teams/nobody/disable", headers=p.h["platform"]), 404, "not_found")


# -- audit -----------------------------------------------------------------------------------------


def audit(p, **params) -> list[dict]:
    resp = p.client.get("/v1/admin/audit", params=params, headers=p.h["platform"])
    assert resp.status_code == 200, resp.text
    return resp.json()["entries"]


def test_state_changing_requests_are_audited_and_reads_are_not(p):
    job = submit(p, "alpha_member")
    p.client.get(f"/v1/jobs/{job['id']}", headers=p.h["alpha_member"])
    p.client.get("/v1/jobs", headers=p.h["alpha_member"])
    p.client.post(f"/v1/jobs/{job['id']}/cancel", headers=p.h["alpha_member"])
    p.client.post("/v1/jobs/j-ffffffffffff/cancel", headers=p.h["beta_member"])
    p.client.post("/v1/team/keys", json={"name": "ci"}, headers=p.h["alpha_member"])  # 403
    p.client.put("/v1/admin/teams/beta/quota", json={"gpus": 1}, headers=p.h["platform"])
    p.client.post("/v1/jobs/j-1/cancel", headers={"Authorization": "Bearer nonsense"})  # 401
    entries = audit(p)
    assert all(e["method"] in {"POST", "PUT", "PATCH", "DELETE"} for e in entries)
    got = [(e["method"], e["route"], e["target"], e["status"], e["key_id"]) for e in reversed(entries)]
    member_a, member_b = key_id_of(p.keys["alpha_member"]), key_id_of(p.keys["beta_member"])
    assert got == [
        ("POST", "/v1/jobs", job["id"], 201, member_a),
        ("POST", "/v1/jobs/{job_id}/cancel", job["id"], 200, member_a),
        ("POST", "/v1/jobs/{job_id}/cancel", "j-ffffffffffff", 404, member_b),
        ("POST", "/v1/team/keys", "", 403, member_a),
        ("PUT", "/v1/admin/teams/{team}/quota", "beta", 200, key_id_of(p.keys["platform"])),
        ("POST", "/v1/jobs/{job_id}/cancel", "j-1", 401, ""),
    ]
    first = entries[-1]
    assert first["team"] == "alpha" and first["role"] == "member" and first["via"] == "key"
    assert first["path"] == "/v1/jobs" and first["ts"] <= time.time()
    # filters: by team (made by or about it), since, limit
    assert {e["route"] for e in audit(p, team="beta")} == {"/v1/jobs/{job_id}/cancel", "/v1/admin/teams/{team}/quota"}
    assert len(audit(p, limit=2)) == 2
    assert audit(p, since=dt.datetime.fromtimestamp(time.time() + 60, dt.UTC).isoformat()) == []
    assert len(audit(p, since=dt.datetime.fromtimestamp(first["ts"] - 0.001, dt.UTC).isoformat())) == len(entries)
    assert len(audit(p, since=str(entries[0]["ts"] - 0.001))) == 1  # unix seconds too


def test_a_new_route_is_audited_without_doing_anything(p):
    router = APIRouter()

    @router.patch("/v1/things/{job_id}")
    def touch(tenant: TenantDep, job_id: str) -> dict:
        return {"ok": True}

    p.app.include_router(router)
    assert p.client.patch("/v1/things/j-42", headers=p.h["beta_admin"]).status_code == 200
    (entry,) = audit(p)
    assert (entry["method"], entry["route"], entry["target"], entry["team"], entry["status"]) == \
        ("PATCH", "/v1/things/{job_id}", "j-42", "beta", 200)


# -- rate limits -----------------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_limit_is_per_key_with_retry_after(mongo_db, logstore, tmp_path):
    clock = FakeClock()
    limiter = RateLimiter(0.5, 3, clock=clock)
    with make_platform(mongo_db, logstore, tmp_path, limiter=limiter) as p:
        for _ in range(3):
            assert p.client.get("/v1/jobs", headers=p.h["alpha_member"]).status_code == 200
        resp = p.client.get("/v1/jobs", headers=p.h["alpha_member"])
        err = assert_error_shape(resp, 429, "resource_exhausted")
        assert resp.headers["retry-after"] == "2" and "retry" in err["message"]
        # another key has its own bucket; a token shares its key's
        assert p.client.get("/v1/jobs", headers=p.h["alpha_admin"]).status_code == 200
        clock.now += 1.9
        assert p.client.get("/v1/jobs", headers=p.h["alpha_member"]).status_code == 429
        clock.now += 0.1
        assert p.client.get("/v1/jobs", headers=p.h["alpha_member"]).status_code == 200
        assert p.client.get("/v1/jobs", headers=p.h["alpha_member"]).status_code == 429
        # refused requests do not count against anyone's bucket but their own, and are audited
        assert p.client.post("/v1/jobs/j-1/cancel", headers=p.h["alpha_member"]).status_code == 429
        (entry,) = [e for e in p.db["audit"].find() if e["status"] == 429]
        assert entry["key_id"] == key_id_of(p.keys["alpha_member"])


def test_rate_limit_settings_are_applied(mongo_db, logstore, tmp_path):
    with make_platform(mongo_db, logstore, tmp_path, rate_limit_per_second=0.001, rate_limit_burst=2) as p:
        codes = [p.client.get("/v1/auth/me", headers=p.h["beta_member"]).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        assert int(p.client.get("/v1/auth/me", headers=p.h["beta_member"]).headers["retry-after"]) > 900


# -- settings -----------------------------------------------------------------------------------


def test_the_default_signing_secret_is_refused_outside_dev_mode(monkeypatch, capsys):
    from pydantic import ValidationError

    from trainforge_services.api import __main__ as api_main
    from trainforge_services.api import identity_cli as admin_tool
    from trainforge_services.common.settings import DEV_JWT_SECRET

    for name in ("TF_DEV_MODE", "TF_JWT_SECRET"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValidationError, match="TF_JWT_SECRET"):
        ApiSettings()
    with pytest.raises(ValidationError, match="TF_JWT_SECRET"):
        ApiSettings(jwt_secret=DEV_JWT_SECRET)
    assert api_main.main() == 2
    assert admin_tool.main(["list-keys", "--team", "x"]) == 2
    assert capsys.readouterr().err.count("TF_JWT_SECRET must be set outside dev mode") == 2
    ApiSettings(jwt_secret="s" * 32)  # a real secret is fine


def test_jwt_settings_the_api_cannot_serve_with_refuse_to_start(monkeypatch, capsys):
    from trainforge_services.api import __main__ as api_main

    with pytest.raises(ValueError, match="RS256"):
        create_app(ApiSettings(dev_mode=True, jwt_algorithms=["RS256"]), trainer=InMemoryTrainer(),
                   identity=object(), logs=object(), objects=object(), audit=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 64 bytes"):
        create_app(ApiSettings(dev_mode=True, jwt_algorithms=["HS512"]), trainer=InMemoryTrainer(),
                   identity=object(), logs=object(), objects=object(), audit=object())  # type: ignore[arg-type]
    monkeypatch.setenv("TF_JWT_SECRET", "only-twenty-chars!!")
    monkeypatch.delenv("TF_DEV_MODE", raising=False)
    assert api_main.main() == 2
    assert "at least 32 bytes" in capsys.readouterr().err

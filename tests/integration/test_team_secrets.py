"""Team secrets over REST: write-only, team-scoped, team admins and platform admins only, sealed at rest.

The value of a secret goes in and never comes out: not in a response, not
in the audit log, not in MongoDB (it is stored encrypted, bound to its team
and name). The Trainer's side (the value reaches the learner) is in
tests/e2e/test_everyday.py; the wrapper that resolves them at deploy time
is checked here against a recording LCM.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.test_api_admin import make_platform
from trainforge_services.common.errors import NotFound, TrainforgeError
from trainforge_services.common.secrets import SecretBox, SecretStore, load_key
from trainforge_services.trainer.secret_env import ResolvingLcm

VALUE = "sk-live-0123456789abcdef-not-for-anyone"


@pytest.fixture
def p(mongo_db, logstore, tmp_path):
    with make_platform(mongo_db, logstore, tmp_path, state_dir=tmp_path / "state") as platform:
        yield platform


def every_document(db) -> str:
    return json.dumps({name: list(db[name].find()) for name in db.list_collection_names()}, default=str)


def test_set_list_delete_never_return_the_value(p):
    seen = []
    resp = p.client.put("/v1/team/secrets/wandb", json={"value": VALUE}, headers=p.h["alpha_admin"])
    assert resp.status_code == 200, resp.text
    seen.append(resp.text)
    assert resp.json()["name"] == "wandb" and resp.json()["team"] == "alpha"
    listed = p.client.get("/v1/team/secrets", headers=p.h["alpha_admin"])
    seen.append(listed.text)
    assert [s["name"] for s in listed.json()["secrets"]] == ["wandb"]
    # another team sees none of it, and cannot delete it
    assert p.client.get("/v1/team/secrets", headers=p.h["beta_admin"]).json() == {"secrets": []}
    assert p.client.delete("/v1/team/secrets/wandb", headers=p.h["beta_admin"]).status_code == 404
    # platform admins manage any team's
    admin = p.client.get("/v1/admin/teams/alpha/secrets", headers=p.h["platform"])
    seen.append(admin.text)
    assert [s["name"] for s in admin.json()["secrets"]] == ["wandb"]
    assert p.client.put("/v1/admin/teams/beta/secrets/hf", json={"value": VALUE},
                        headers=p.h["platform"]).status_code == 200
    assert p.client.put("/v1/admin/teams/nope/secrets/hf", json={"value": "x"},
                        headers=p.h["platform"]).status_code == 404
    seen.append(p.client.get("/v1/admin/audit", headers=p.h["platform"]).text)
    assert any(e["route"] == "/v1/team/secrets/{name}" for e in json.loads(seen[-1])["entries"])
    for text in seen:
        assert VALUE not in text
    documents = every_document(p.db)
    assert VALUE not in documents and "ciphertext" in documents
    gone = p.client.delete("/v1/team/secrets/wandb", headers=p.h["alpha_admin"])
    assert gone.status_code == 200 and VALUE not in gone.text
    assert p.client.get("/v1/team/secrets", headers=p.h["alpha_admin"]).json() == {"secrets": []}


def test_members_cannot_touch_secrets_and_names_are_checked(p):
    for method in ("GET", "PUT", "DELETE"):
        path = "/v1/team/secrets" if method == "GET" else "/v1/team/secrets/wandb"
        resp = p.client.request(method, path, json={"value": "x"}, headers=p.h["alpha_member"])
        assert resp.status_code == 403, (method, resp.text)
    bad = p.client.put("/v1/team/secrets/Not%20Valid", json={"value": "x"}, headers=p.h["alpha_admin"])
    assert bad.status_code == 422 and bad.json()["error"]["details"][0]["field"] == "name"
    empty = p.client.put("/v1/team/secrets/ok", json={"value": ""}, headers=p.h["alpha_admin"])
    assert empty.status_code == 422 and empty.json()["error"]["details"][0]["field"] == "value"


def test_sealed_values_are_bound_to_their_team_and_name(mongo_db, tmp_path):
    store = SecretStore(mongo_db, SecretBox(load_key("", dev_mode=True, state_dir=tmp_path)))
    store.put("alpha", "wandb", VALUE)
    doc = mongo_db["secrets"].find_one({"_id": "alpha/wandb"})
    assert VALUE not in json.dumps(doc, default=str)
    # a ciphertext copied into another team's record does not open there
    mongo_db["secrets"].insert_one({**doc, "_id": "beta/wandb", "team": "beta"})
    with pytest.raises(TrainforgeError, match="another team"):
        store.reveal("beta", {"wandb"})
    assert store.reveal("alpha", {"wandb"}) == {"wandb": VALUE}
    # another key opens nothing
    other = SecretStore(mongo_db, SecretBox(load_key("", dev_mode=True, state_dir=tmp_path / "other")))
    with pytest.raises(TrainforgeError, match="cannot be decrypted"):
        other.reveal("alpha", {"wandb"})


def test_the_key_is_required_outside_dev_mode_and_made_once_in_dev_mode(tmp_path):
    with pytest.raises(ValueError, match="required outside dev mode"):
        load_key("", dev_mode=False, state_dir=tmp_path)
    with pytest.raises(ValueError, match="Fernet key"):
        load_key("too-short", dev_mode=False, state_dir=tmp_path)
    first = load_key("", dev_mode=True, state_dir=tmp_path)
    assert load_key("", dev_mode=True, state_dir=tmp_path) == first
    assert (tmp_path / "secrets.key").stat().st_mode & 0o777 == 0o600


class RecordingLcm:
    def __init__(self):
        self.calls = []

    def deploy_job(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return ["pid:1"]


def test_deploys_carry_the_values_only_for_jobs_that_name_secrets(mongo_db, tmp_path):
    store = SecretStore(mongo_db, SecretBox(load_key("", dev_mode=True, state_dir=tmp_path)))
    store.put("alpha", "wandb", VALUE)
    inner = RecordingLcm()
    lcm = ResolvingLcm(inner, store.reveal, lambda team, manifest, **_: [])  # names no object
    plain = json.dumps({"name": "a", "command": "true", "env": {"X": "1"}})
    lcm.deploy_job("j-1", "alpha", 1, plain, "")
    assert inner.calls[-1][1] == {}  # unchanged call for a job without secrets
    uses = json.dumps({"name": "a", "command": "true", "env": {"K": {"secret": "wandb"}, "X": "1"}})
    lcm.deploy_job("j-2", "alpha", 1, uses, "")
    assert inner.calls[-1][1] == {"secret_env": {"K": VALUE}}
    with pytest.raises(NotFound, match="'wandb'"):
        lcm.deploy_job("j-3", "beta", 1, uses, "")

"""No plaintext key (or token) ever lands in the database, whatever was done with it."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_api_admin import bearer, make_platform

JOB = json.dumps({"name": "tiny", "framework": "custom", "command": "true"})


@pytest.fixture
def p(mongo_db, logstore, tmp_path):
    with make_platform(mongo_db, logstore, tmp_path) as platform:
        yield platform


def every_document(db) -> str:
    """Every document of every collection, serialized."""
    names = db.list_collection_names()
    assert {"api_keys", "teams", "audit"} <= set(names)
    return json.dumps({name: list(db[name].find()) for name in names}, default=str)


def test_no_collection_holds_a_plaintext_key_or_token(p):
    secrets_seen: list[str] = list(p.keys.values())
    issued = [p.client.post("/v1/team/keys", json={"name": f"k{i}", "role": role}, headers=p.h["alpha_admin"]).json()
              for i, role in enumerate(("member", "team_admin"))]
    issued.append(p.client.post("/v1/admin/teams/beta/keys", json={"name": "robot"}, headers=p.h["platform"]).json())
    for item in issued:
        key = item["key"]
        secrets_seen.append(key)
        # use it: jobs, an audited POST, a token, the token itself, a wrong secret for the same id
        assert p.client.post("/v1/jobs", data={"manifest": JOB}, headers=bearer(key)).status_code == 201
        token = p.client.post("/v1/auth/token", headers=bearer(key)).json()["token"]
        secrets_seen.append(token)
        assert p.client.get("/v1/jobs", headers=bearer(token)).status_code == 200
        assert p.client.post("/v1/jobs", data={"manifest": JOB}, headers=bearer(token)).status_code == 201
        wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
        secrets_seen.append(wrong)
        assert p.client.post("/v1/jobs", data={"manifest": JOB}, headers=bearer(wrong)).status_code == 401
    p.client.delete(f"/v1/team/keys/{issued[0]['key_id']}", headers=p.h["alpha_admin"])
    for key in p.keys.values():
        p.client.post("/v1/auth/token", headers=bearer(key))

    dump = every_document(p.db)
    assert '"hash"' in dump and issued[0]["key_id"] in dump  # the scan does see the key records
    for secret in secrets_seen:
        parts = [secret, secret.split("_", 2)[-1]] if secret.startswith("tf_") else [secret, secret.rsplit(".", 1)[1]]
        for part in parts:
            assert part not in dump, f"{part[:12]}... is stored in the database"

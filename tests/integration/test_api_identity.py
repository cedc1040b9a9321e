"""API keys in the real MongoDB-wire server: never stored in plaintext, verified in constant time."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

from trainforge_services.api import identity as identity_mod
from trainforge_services.api.identity import IdentityStore, Role, Tenant, key_id_of
from trainforge_services.common.errors import InvalidArgument, NotFound, Unauthenticated


@pytest.fixture
def store(mongo_db):
    s = IdentityStore(mongo_db, touch_interval=0)
    s.create_team("alpha")
    return s


def all_documents(db) -> str:
    return json.dumps([list(db[name].find()) for name in db.list_collection_names()], default=str)


def test_keys_are_stored_only_as_hash_and_prefix(store, mongo_db):
    keys = [store.issue_key("alpha", f"k{i}", role) for i, role in enumerate(Role)]
    dump = all_documents(mongo_db)
    for key in keys:
        secret = key.split("_", 2)[2]
        assert key not in dump and secret not in dump
        doc = mongo_db["api_keys"].find_one({"_id": key_id_of(key)})
        assert doc["hash"] == hashlib.sha256(key.encode()).hexdigest()
        assert {"team", "name", "role", "created_at", "last_used_at", "expires_at", "revoked"} <= set(doc)
    assert len(set(keys)) == 3
    # 256 bits of secret, urlsafe
    assert all(len(k.split("_", 2)[2]) >= 43 for k in keys)


def test_authenticate_returns_the_tenant_and_records_use(store, mongo_db):
    key = store.issue_key("alpha", "ci", Role.TEAM_ADMIN)
    before = time.time()
    tenant = store.authenticate(key)
    assert tenant == Tenant(team="alpha", key_id=key_id_of(key), role=Role.TEAM_ADMIN)
    assert tenant.actor == f"user:{key_id_of(key)}"
    assert mongo_db["api_keys"].find_one({"_id": key_id_of(key)})["last_used_at"] >= before


def test_every_failure_is_unauthenticated(store):
    key = store.issue_key("alpha", "ci")
    forged = key[:-1] + ("A" if key[-1] != "A" else "B")
    unknown_prefix = "tf_ffffffff_" + key.split("_", 2)[2]
    for bad in ("", "tf_", "Bearer " + key, key + " ", forged, unknown_prefix, key.upper()):
        with pytest.raises(Unauthenticated):
            store.authenticate(bad)


def test_verification_always_compares_in_constant_time(store, monkeypatch):
    key = store.issue_key("alpha", "ci")
    calls = []
    real = identity_mod.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(identity_mod.hmac, "compare_digest", spy)
    secret = key.split("_", 2)[2]
    for presented in (key, key[:-1] + ("A" if key[-1] != "A" else "B"), "tf_0badbeef_" + secret):
        try:
            store.authenticate(presented)
        except Unauthenticated:
            pass
    # one comparison per attempt, an unknown prefix included (against a dummy hash)
    assert len(calls) == 3
    assert all(len(a) == len(b) == 64 for a, b in calls)


def test_revoked_and_expired_keys_are_rejected(store):
    key = store.issue_key("alpha", "ci")
    store.authenticate(key)
    store.revoke_key(key_id_of(key))
    with pytest.raises(Unauthenticated, match="revoked"):
        store.authenticate(key)
    old = store.issue_key("alpha", "temp", expires_at=time.time() - 1)
    with pytest.raises(Unauthenticated, match="expired"):
        store.authenticate(old)
    with pytest.raises(NotFound):
        store.revoke_key("00000000")


def test_teams_are_created_once_and_named_safely(store):
    assert store.create_team("beta") is True
    assert store.create_team("beta") is False
    with pytest.raises(InvalidArgument):
        store.create_team("Not A Team")
    with pytest.raises(NotFound):
        store.issue_key("nobody", "k")
    listed = store.list_keys("alpha")
    assert listed == []
    store.issue_key("alpha", "one")
    (entry,) = store.list_keys("alpha")
    assert "hash" not in entry and entry["name"] == "one"


def test_admin_bootstrap_prints_a_working_key_once(mongo_server, mongo_db, unique):
    env = {**os.environ, "TF_DEV_MODE": "1", "TF_MONGO_URL": mongo_server.url, "TF_MONGO_DB": mongo_db.name}

    def bootstrap():
        proc = subprocess.run([sys.executable, "-m", "trainforge_services.api.identity_cli", "bootstrap", "--team", "local", "--json"],
                              env=env, capture_output=True, text=True, timeout=60, check=True)
        return json.loads(proc.stdout)

    first = bootstrap()
    assert first["team"] == "local" and first["key_id"] == key_id_of(first["key"])
    tenant = IdentityStore(mongo_db).authenticate(first["key"])
    assert tenant.team == "local" and tenant.role == Role.TEAM_ADMIN
    second = bootstrap()  # the team exists already: just another key
    assert second["key"] != first["key"]
    assert [t["_id"] for t in mongo_db["teams"].find()] == ["local"]
    assert first["key"] not in all_documents(mongo_db)

"""The API's authentication cache against the real MongoDB-wire server: a revoked key, a disabled team
and an expired key stop working within the cache's bound (≤ 1 s), whichever replica changed them; also over
HTTP, where a cached GET is authenticated on the event loop and its job comes from the job read cache."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from pydantic import ValidationError

from tests.integration import api_replicas
from trainforge_services.api.authcache import AuthCache
from trainforge_services.api.identity import IdentityStore, Role, Tenant, key_id_of
from trainforge_services.common.errors import InvalidArgument, Unauthenticated
from trainforge_services.common.settings import ApiSettings

TTL = 1.0
# Scheduling slack on a loaded 2-core machine; the bound itself is TTL (checked_at precedes the store read).
SLACK = 0.5


@pytest.fixture
def replicas(mongo_db):
    """Two API replicas' identity stores on one database: `a` caches, `b` makes the changes."""
    a = IdentityStore(mongo_db, cache_seconds=TTL)
    b = IdentityStore(mongo_db)
    b.create_team("alpha")
    return a, b


def refused_within(call, deadline: float) -> float:
    """Seconds until `call` raises Unauthenticated, polling; fails past `deadline` seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline:
        try:
            call()
        except Unauthenticated:
            return time.monotonic() - t0
        time.sleep(0.01)
    pytest.fail(f"still accepted {deadline}s after the change")


def test_a_hit_skips_the_store(replicas, monkeypatch):
    a, b = replicas
    key = b.issue_key("alpha", "ci")
    reads = []
    real = a._find_key
    monkeypatch.setattr(a, "_find_key", lambda key_id: reads.append(key_id) or real(key_id))
    tenant = a.authenticate(key)
    for _ in range(5):
        assert a.authenticate(key) == tenant
    assert 1 <= len(reads) < 6  # the first check read it; hits inside the TTL did not


def test_a_wrong_secret_is_refused_even_while_the_key_is_cached(replicas):
    a, b = replicas
    key = b.issue_key("alpha", "ci")
    a.authenticate(key)
    forged = key[:-1] + ("A" if key[-1] != "A" else "B")
    with pytest.raises(Unauthenticated):
        a.authenticate(forged)


def test_revocation_by_another_replica_is_seen_within_the_ttl(replicas):
    a, b = replicas
    key = b.issue_key("alpha", "ci")
    a.authenticate(key)  # cached now
    b.revoke_key(key_id_of(key))
    assert refused_within(lambda: a.authenticate(key), TTL + SLACK) <= TTL + SLACK


def test_revocation_through_the_same_replica_is_immediate(replicas):
    a, b = replicas
    key = b.issue_key("alpha", "ci")
    a.authenticate(key)
    a.revoke_key(key_id_of(key))
    with pytest.raises(Unauthenticated, match="revoked"):
        a.authenticate(key)


def test_a_disabled_team_is_refused_within_the_ttl(replicas):
    a, b = replicas
    key = b.issue_key("alpha", "ci")
    a.authenticate(key)
    b.set_team_disabled("alpha", True)
    assert refused_within(lambda: a.authenticate(key), TTL + SLACK) <= TTL + SLACK
    b.set_team_disabled("alpha", False)
    assert a.authenticate(key).team == "alpha"


def test_expiry_is_honoured_on_a_cached_key(replicas):
    a, b = replicas
    expires = time.time() + 0.6
    key = b.issue_key("alpha", "short", expires_at=expires)
    a.authenticate(key)  # cached, with the key's expiry
    # wait for the clock to pass the expiry (well inside the TTL of the entry made above)
    while time.time() <= expires:
        time.sleep(0.01)
    with pytest.raises(Unauthenticated):
        a.authenticate(key)


def test_a_token_s_key_revoked_elsewhere_is_seen_within_the_ttl(replicas):
    a, b = replicas
    key = b.issue_key("alpha", "ci")
    key_id = key_id_of(key)
    assert a.tenant_of(key_id, via="jwt").via == "jwt"
    b.revoke_key(key_id)
    assert refused_within(lambda: a.tenant_of(key_id, via="jwt"), TTL + SLACK) <= TTL + SLACK


def test_failures_are_not_cached(replicas):
    a, b = replicas
    key = b.issue_key("alpha", "ci")
    b.revoke_key(key_id_of(key))
    with pytest.raises(Unauthenticated):
        a.authenticate(key)
    # nothing remembered the refusal: the next check reads the store again and refuses again
    with pytest.raises(Unauthenticated):
        a.authenticate(key)


def test_the_bound_is_enforced():
    with pytest.raises(InvalidArgument) as e:
        AuthCache(1.5)
    assert e.value.details[0]["field"] == "auth_cache_seconds"
    with pytest.raises(ValidationError, match="auth_cache_seconds"):
        ApiSettings(dev_mode=True, auth_cache_seconds=2)


def test_entries_are_bounded(monkeypatch):
    from trainforge_services.api import authcache

    monkeypatch.setattr(authcache, "MAX_ENTRIES", 3)
    cache = AuthCache(1.0)
    for i in range(4):
        cache.put(str(i), Tenant(team="t", key_id=f"{i:08x}", role=Role.MEMBER), None, time.monotonic())
    assert cache.get("3") is not None and cache.get("0") is None


# -- over HTTP: a cached GET (auth cache hit answered on the event loop, the job from the job read cache)
# still refuses a revoked, expired or disabled caller within the bound ---------------------------------


@pytest.fixture
def api(mongo_server, mongo_db, logstore, tmp_path, unique):
    # polling every 10 ms is over the default per-key limit; the limit's own test is in test_api_job_cache.py
    with api_replicas.replicas(mongo_server, mongo_db, logstore, tmp_path, unique, rate_limit_per_second=1000,
                               rate_limit_burst=1000) as p:
        p.job = api_replicas.submit(p.a, p.h["alpha"])
        yield p


def http_refused_within(get, deadline: float) -> float:
    """Seconds until `get()` answers 401 (`refused_within` over HTTP); fails on anything but 200/401."""
    def call() -> None:
        status = get().status_code
        assert status in (200, 401), status
        if status == 401:
            raise Unauthenticated("401")

    return refused_within(call, deadline)


def warm(api, headers: dict) -> Callable[[], httpx.Response]:
    """A GET of the job on replica a, made twice so the key and the job are in a's caches."""
    url = f"/v1/jobs/{api.job['id']}"
    for _ in range(2):
        assert api.a.http.get(url, headers=headers).status_code == 200
    return lambda: api.a.http.get(url, headers=headers)


def test_a_cached_get_skips_the_store_and_the_thread_pool(api, monkeypatch):
    get = warm(api, api.h["alpha"])
    reads = []
    real = api.a.identity._find_key
    monkeypatch.setattr(api.a.identity, "_find_key", lambda key_id: reads.append(key_id) or real(key_id))
    t0 = time.monotonic()
    for _ in range(10):
        assert get().status_code == 200
    assert len(reads) <= 1 + (time.monotonic() - t0) / TTL


def test_a_key_revoked_on_another_replica_is_refused_over_http_within_the_ttl(api):
    get = warm(api, api.h["alpha"])
    api.seed.revoke_key(key_id_of(api.keys["alpha"]))
    assert http_refused_within(get, TTL + SLACK) <= TTL + SLACK
    assert get().json()["error"]["code"] == "unauthenticated"


def test_a_key_revoked_through_the_same_replica_is_refused_at_once(api):
    get = warm(api, api.h["alpha"])
    key_id = key_id_of(api.keys["alpha"])
    resp = api.a.http.delete(f"/v1/admin/keys/{key_id}", headers=api.h["ops"])
    assert resp.status_code == 200, resp.text
    assert get().status_code == 401


def test_a_team_disabled_on_another_replica_is_refused_over_http_within_the_ttl(api):
    get = warm(api, api.h["alpha"])
    api.seed.set_team_disabled("alpha", True)
    assert http_refused_within(get, TTL + SLACK) <= TTL + SLACK


def test_a_key_expiring_while_cached_is_refused_over_http_at_its_expiry(api):
    expires = time.time() + 1.5
    key = api.seed.issue_key("alpha", "short", expires_at=expires)
    get = warm(api, {"Authorization": f"Bearer {key}"})
    while time.time() <= expires:
        time.sleep(0.01)
    assert get().status_code == 401


def test_a_token_whose_key_is_revoked_elsewhere_is_refused_over_http_within_the_ttl(api):
    resp = api.a.http.post("/v1/auth/token", headers=api.h["alpha"])
    assert resp.status_code == 200, resp.text
    token = resp.json()["token"]
    get = warm(api, {"Authorization": f"Bearer {token}"})
    api.seed.revoke_key(key_id_of(api.keys["alpha"]))
    assert http_refused_within(get, TTL + SLACK) <= TTL + SLACK


def test_a_forged_secret_is_refused_while_the_key_is_cached_over_http(api):
    warm(api, api.h["alpha"])
    key = api.keys["alpha"]
    forged = key[:-1] + ("A" if key[-1] != "A" else "B")
    resp = api.a.http.get(f"/v1/jobs/{api.job['id']}", headers={"Authorization": f"Bearer {forged}"})
    assert resp.status_code == 401

"""The API's authentication cache against the real MongoDB-wire server: a revoked key, a disabled team
and an expired key stop working within the cache's bound (≤ 1 s), whichever replica changed them."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

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

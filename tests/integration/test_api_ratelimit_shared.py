"""Per-key limits kept in the real MongoDB-wire server, one allowance across API replicas."""

from __future__ import annotations

import threading

import pytest

from tests.integration.test_api_admin import FakeClock, assert_error_shape, make_platform
from trainforge_services.api.ratelimit import RateLimited
from trainforge_services.api.ratelimit_shared import SharedRateLimiter

pytestmark = pytest.mark.integration


def test_two_replicas_spend_one_bucket_per_key(mongo_db, unique):
    clock = FakeClock()
    a, b = (SharedRateLimiter(mongo_db, 0.5, 3, collection=f"limits_{unique}", clock=clock) for _ in range(2))
    a.check("key-1")
    b.check("key-1")
    a.check("key-1")
    with pytest.raises(RateLimited, match="retry in 2.0s") as refused:
        b.check("key-1")
    assert refused.value.headers == {"Retry-After": "2"}
    b.check("key-2")  # another key has its own bucket
    clock.now += 1.9
    with pytest.raises(RateLimited):
        a.check("key-1")
    clock.now += 0.1
    b.check("key-1")
    with pytest.raises(RateLimited):
        a.check("key-1")


def test_replicas_racing_for_the_last_tokens_let_through_exactly_the_burst(mongo_db, unique):
    clock = FakeClock()  # frozen: no token comes back while they race
    limiters = [SharedRateLimiter(mongo_db, 1.0, 5, collection=f"limits_{unique}", clock=clock) for _ in range(2)]
    allowed, refused = [], []
    lock = threading.Lock()

    def spend(limiter: SharedRateLimiter) -> None:
        for _ in range(6):
            try:
                limiter.check("hot-key")
                outcome = allowed
            except RateLimited:
                outcome = refused
            with lock:
                outcome.append(1)

    threads = [threading.Thread(target=spend, args=(limiters[i % 2],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert (len(allowed), len(refused)) == (5, 19)


def test_the_api_answers_429_from_the_shared_limit(mongo_db, logstore, tmp_path, unique):
    limiter = SharedRateLimiter(mongo_db, 0.001, 2, collection=f"limits_{unique}")
    with make_platform(mongo_db, logstore, tmp_path, limiter=limiter) as p:
        codes = [p.client.get("/v1/auth/me", headers=p.h["beta_member"]).status_code for _ in range(2)]
        assert codes == [200, 200]
        resp = p.client.get("/v1/auth/me", headers=p.h["beta_member"])
        assert_error_shape(resp, 429, "resource_exhausted")
        assert int(resp.headers["retry-after"]) > 900

"""GET /v1/jobs/{id}'s per-replica read cache (services/api/jobcache.py) against a real Trainer and store: a
change made elsewhere is seen within the cache's bound, this replica's own writes at once, the body is what the
uncached route sends, another team still gets 404, and failures are not cached."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from tests.integration.api_replicas import JOB_TTL, replicas, submit
from tests.servers import serve_app
from trainforge_services.api.app import create_app
from trainforge_services.api.jobcache import CachingTrainer
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.settings import ApiSettings

# Scheduling slack on a loaded 2-core machine; the bound itself is JOB_TTL (the entry's time precedes the read).
SLACK = 0.5


@pytest.fixture
def p(mongo_server, mongo_db, logstore, tmp_path, unique):
    with replicas(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        yield p


def counting(side, monkeypatch) -> list[str]:
    """The job ids this replica asks the Trainer for from now on."""
    cache = side.app.state.trainer
    assert isinstance(cache, CachingTrainer)
    asked: list[str] = []
    real = cache.inner.get_job
    monkeypatch.setattr(cache.inner, "get_job", lambda team, job_id: asked.append(job_id) or real(team, job_id))
    return asked


def test_a_hot_job_is_read_from_the_trainer_once_per_bound(p, monkeypatch):
    job = submit(p.a, p.h["alpha"])
    asked = counting(p.a, monkeypatch)
    t0 = time.monotonic()
    for _ in range(30):
        resp = p.a.http.get(f"/v1/jobs/{job['id']}", headers=p.h["alpha"])
        assert resp.status_code == 200 and resp.json()["id"] == job["id"]
    elapsed = time.monotonic() - t0
    # the submit stored the job; after that at most one Trainer read per JOB_TTL of wall time
    assert len(asked) <= 1 + elapsed / JOB_TTL, (len(asked), elapsed)
    assert len(asked) < 30


def test_a_change_through_another_replica_is_seen_within_the_bound(p):
    job = submit(p.a, p.h["alpha"])
    url = f"/v1/jobs/{job['id']}"
    assert p.a.http.get(url, headers=p.h["alpha"]).json()["state"] != "cancelled"  # cached on a now
    resp = p.b.http.post(f"{url}/cancel", headers=p.h["alpha"])
    assert resp.status_code == 200 and resp.json()["state"] == "cancelled"
    t0 = time.monotonic()
    while p.a.http.get(url, headers=p.h["alpha"]).json()["state"] != "cancelled":
        assert time.monotonic() - t0 <= JOB_TTL + SLACK, "replica a still serves the job as it was before"
        time.sleep(0.02)
    # and replica b read its own write at once
    assert p.b.http.get(url, headers=p.h["alpha"]).json()["state"] == "cancelled"


def test_a_write_through_this_replica_is_read_back_at_once(p):
    job = submit(p.a, p.h["alpha"])
    url = f"/v1/jobs/{job['id']}"
    assert p.a.http.get(url, headers=p.h["alpha"]).json()["state"] != "cancelled"
    assert p.a.http.post(f"{url}/cancel", headers=p.h["alpha"]).status_code == 200
    body = p.a.http.get(url, headers=p.h["alpha"]).json()
    assert body["state"] == "cancelled"
    assert body["history"][-1]["to"] == "cancelled"


def test_other_routes_read_the_job_fresh(p, monkeypatch):
    job = submit(p.a, p.h["alpha"])
    url = f"/v1/jobs/{job['id']}"
    assert p.a.http.get(url, headers=p.h["alpha"]).json()["state"] != "cancelled"  # cached on a now
    assert p.b.http.post(f"{url}/cancel", headers=p.h["alpha"]).status_code == 200
    asked = counting(p.a, monkeypatch)
    logs = p.a.http.get(f"{url}/logs", headers=p.h["alpha"])
    assert logs.status_code == 200, logs.text
    assert asked == [job["id"]]  # the logs route asked the Trainer, whatever the cache holds
    assert logs.json()["job_state"] == "cancelled"


def test_another_team_gets_404_while_the_job_is_cached(p):
    job = submit(p.a, p.h["alpha"])
    url = f"/v1/jobs/{job['id']}"
    assert p.a.http.get(url, headers=p.h["alpha"]).status_code == 200
    theirs = p.a.http.get(url, headers=p.h["beta"])
    missing = p.a.http.get("/v1/jobs/j-000000000000", headers=p.h["beta"])
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"]["code"] == "not_found"
    # exactly the answer for a missing id: nothing of the cached job
    assert theirs.text.replace(job["id"], "j-000000000000") == missing.text


def test_a_missing_job_is_not_cached(p, monkeypatch):
    asked = counting(p.a, monkeypatch)
    for _ in range(3):
        assert p.a.http.get("/v1/jobs/j-000000000000", headers=p.h["alpha"]).status_code == 404
    assert asked == ["j-000000000000"] * 3


def test_the_cached_body_is_what_the_uncached_route_sends(p, tmp_path, logstore):
    job = submit(p.a, p.h["alpha"])
    url = f"/v1/jobs/{job['id']}"
    p.a.http.post(f"{url}/cancel", headers=p.h["alpha"])  # a settled job, so both reads see the same
    cached = p.a.http.get(url, headers=p.h["alpha"])
    # the same Trainer client handed in: the app uses it as it is, and FastAPI renders the response model
    plain = create_app(ApiSettings(dev_mode=True, state_dir=tmp_path, retention_interval=0),
                       trainer=p.a.app.state.trainer.inner, identity=p.a.identity, logs=logstore,
                       objects=LocalStore(tmp_path / "objects"))
    assert not isinstance(plain.state.trainer, CachingTrainer)
    with serve_app(plain) as plain_url:
        uncached = p.a.http.get(f"{plain_url}{url}", headers=p.h["alpha"])
    assert cached.status_code == uncached.status_code == 200
    assert cached.content == uncached.content
    assert cached.headers["content-type"] == uncached.headers["content-type"]


def test_cached_reads_still_count_against_the_key_s_rate_limit(mongo_server, mongo_db, logstore, tmp_path, unique):
    with replicas(mongo_server, mongo_db, logstore, tmp_path, unique, rate_limit_per_second=0.2,
                  rate_limit_burst=5) as p:
        job = submit(p.a, p.h["alpha"])  # the submit is the first of the 5
        t0 = time.monotonic()
        answers = [p.a.http.get(f"/v1/jobs/{job['id']}", headers=p.h["alpha"]) for _ in range(8)]
        codes = [r.status_code for r in answers]
        # 4 left in the burst, and one more per 5 s the loop took
        assert 4 <= codes.count(200) <= 4 + int((time.monotonic() - t0) * 0.2), codes
        refused = next(r for r in answers if r.status_code == 429)
        assert int(refused.headers["Retry-After"]) >= 1
        assert p.a.http.get(f"/v1/jobs/{job['id']}", headers=p.h["beta"]).status_code == 404  # beta's own bucket


def test_the_bound_is_enforced(p):
    with pytest.raises(InvalidArgument) as e:
        CachingTrainer(p.a.app.state.trainer.inner, 1.5)
    assert e.value.details[0]["field"] == "job_cache_seconds"
    with pytest.raises(ValidationError, match="job_cache_seconds"):
        ApiSettings(dev_mode=True, job_cache_seconds=2)

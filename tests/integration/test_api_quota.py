"""Team quotas through the admin routes: set and reported, cohorts and their limits, a team's egress policy,
field-by-field validation, and the cluster view (the in-memory Trainer twin; the platform of test_api_admin)."""

from __future__ import annotations

import pytest

from tests.integration.test_api_admin import make_platform, submit
from tests.integration.test_api_app import assert_error_shape
from trainforge_services.api.identity import key_id_of
from trainforge_services.common.states import JobState


@pytest.fixture
def p(mongo_db, logstore, tmp_path):
    with make_platform(mongo_db, logstore, tmp_path) as platform:
        yield platform


def test_set_quota_calls_the_trainer_and_reports_usage(p):
    body = {"gpus": 8, "cpus": 32, "memory": "64Gi", "jobs": 3, "gpus_by_type": {"a100": 4}}
    resp = p.client.put("/v1/admin/teams/alpha/quota", json=body, headers=p.h["platform"])
    assert resp.status_code == 200, resp.text
    report = resp.json()
    assert report["quota"] == {"gpus": 8, "cpus": 32.0, "memory": 64 * 2**30, "jobs": 3, "gpus_by_type": {"a100": 4},
                               "cohort": "", "lending_limit": None, "borrowing_limit": None,
                               "egress": None}
    (req,) = p.trainer.quota_requests
    assert req["team"] == "alpha" and req["actor"] == f"user:{key_id_of(p.keys['platform'])}"
    assert req["quota"]["memory"] == 64 * 2**30

    job = submit(p, "alpha_member")
    submit(p, "alpha_member")
    p.trainer.report(job["id"], JobState.DEPLOYING, "dispatched", actor="trainer")
    own = p.client.get("/v1/team/usage", headers=p.h["alpha_member"]).json()
    assert own["team"] == "alpha" and own["quota"]["gpus"] == 8
    assert own["in_use"] == {"gpus": 2, "cpus": 4.0, "memory": 2 * 2**30, "jobs": 1, "gpus_by_type": {"a100": 2},
                             "egress": None}
    assert own["queued_jobs"] == 1 and own["active_jobs"] == 1
    assert p.client.get("/v1/admin/teams/alpha/usage", headers=p.h["platform"]).json() == own
    beta = p.client.get("/v1/team/usage", headers=p.h["beta_member"]).json()
    assert beta["quota"]["gpus"] is None and beta["in_use"]["jobs"] == 0
    every = p.client.get("/v1/admin/usage", headers=p.h["platform"]).json()["teams"]
    assert [u["team"] for u in every] == ["alpha"]

    # replaced whole: what is left out is no limit
    again = p.client.put("/v1/admin/teams/alpha/quota", json={"gpus": 2}, headers=p.h["platform"]).json()
    assert again["quota"] == {"gpus": 2, "cpus": None, "memory": None, "jobs": None, "gpus_by_type": {},
                              "cohort": "", "lending_limit": None, "borrowing_limit": None,
                              "egress": None}


def test_a_quota_names_its_cohort_and_its_lending_and_borrowing_limits(p):
    body = {"gpus": 4, "memory": "64Gi", "cohort": "lab", "lending_limit": {"gpus": 2, "memory": "16Gi"},
            "borrowing_limit": {"gpus": 8}}
    resp = p.client.put("/v1/admin/teams/alpha/quota", json=body, headers=p.h["platform"])
    assert resp.status_code == 200, resp.text
    quota = resp.json()["quota"]
    assert (quota["cohort"], quota["lending_limit"], quota["borrowing_limit"]) == \
        ("lab", {"gpus": 2, "cpus": None, "memory": 16 * 2**30}, {"gpus": 8, "cpus": None, "memory": None})
    (req,) = p.trainer.quota_requests
    assert req["quota"]["lending_limit"]["memory"] == 16 * 2**30
    bad = {"cohort": "Lab X", "lending_limit": {"gpus": -1, "tpus": 1}, "borrowing_limit": {"memory": "lots"}}
    err = assert_error_shape(p.client.put("/v1/admin/teams/alpha/quota", json=bad, headers=p.h["platform"]), 422,
                             "invalid_argument")
    assert {d["field"] for d in err["details"]} == {"cohort", "lending_limit.gpus", "lending_limit.tpus",
                                                    "borrowing_limit.memory"}


def test_a_teams_egress_policy_is_set_with_its_quota_normalised_and_validated(p):
    put = p.client.put("/v1/admin/teams/alpha/quota", json={"egress": " store, PyPI.internal:443 "},
                       headers=p.h["platform"])
    assert put.status_code == 200, put.text
    assert put.json()["quota"]["egress"] == "store,pypi.internal:443"
    assert p.trainer.quota_requests[-1]["quota"]["egress"] == "store,pypi.internal:443"
    assert p.client.put("/v1/admin/teams/alpha/quota", json={"egress": "none"},
                        headers=p.h["platform"]).json()["quota"]["egress"] == "none"
    for bad, says in (("pypi.internal", "neither `store` nor host:port"), ("h:70000", "no port between")):
        err = assert_error_shape(p.client.put("/v1/admin/teams/alpha/quota", json={"egress": bad},
                                              headers=p.h["platform"]), 422, "invalid_argument")
        assert [d["field"] for d in err["details"]] == ["egress"] and says in err["message"], err


def test_the_cluster_view_is_for_platform_admins(p):
    p.trainer.capacity = {"gpus": 4, "cpus": 16.0, "memory": 64 * 2**30, "learners": 8}
    submit(p, "alpha_member")
    view = p.client.get("/v1/admin/cluster", headers=p.h["platform"]).json()
    assert view["known"] and view["capacity"]["gpus"] == 4 and view["queued_jobs"] == 1
    assert view["free"] == view["capacity"]  # a queued job holds nothing
    for who in ("alpha_member", "alpha_admin"):
        assert_error_shape(p.client.get("/v1/admin/cluster", headers=p.h[who]), 403, "permission_denied")


def test_quota_fields_are_validated_by_name(p):
    body = {"gpus": -1, "cpus": "many", "memory": "lots", "jobs": 2**40, "gpus_by_type": {"A100": 1, "h100": -2},
            "gpu": 4}
    err = assert_error_shape(p.client.put("/v1/admin/teams/alpha/quota", json=body, headers=p.h["platform"]), 422,
                             "invalid_argument")
    fields = {d["field"] for d in err["details"]}
    assert fields == {"gpus", "cpus", "memory", "jobs", "gpus_by_type.A100", "gpus_by_type.h100", "gpu"}
    for field in fields:
        assert field in err["message"]
    assert p.trainer.quota_requests == []
    for memory, expected in (("512Mi", 512 * 2**20), ("1.5Gi", 3 * 2**29), ("8G", 8 * 10**9), (0, 0), ("1T", 10**12)):
        resp = p.client.put("/v1/admin/teams/alpha/quota", json={"memory": memory}, headers=p.h["platform"])
        assert resp.json()["quota"]["memory"] == expected
    assert_error_shape(p.client.put("/v1/admin/teams/nobody/quota", json={}, headers=p.h["platform"]), 404,
                       "not_found")

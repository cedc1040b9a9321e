"""Job and audit lists: cursor pages that neither skip nor repeat, filters by name and time, admins across teams.

Served for real against a real Trainer (its MongoDB job store runs the
keyset queries) and the real audit log.
"""

from __future__ import annotations

import json
import time

from tests.integration.test_webhooks import platform


def submit(p, name: str, who: str = "member") -> dict:
    resp = p.http.post("/v1/jobs", data={"manifest": json.dumps({"name": name, "framework": "custom",
                                                                  "command": "true"})}, headers=p.h[who])
    assert resp.status_code == 201, resp.text
    return resp.json()


def all_pages(p, path: str, key: str, who: str, **params) -> list[list[dict]]:
    pages, cursor = [], None
    while True:
        body = p.http.get(path, params={**params, **({"cursor": cursor} if cursor else {})}, headers=p.h[who]).json()
        pages.append(body[key])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


def test_job_pages_filters_and_admin_listing(mongo_server, mongo_db, logstore, tmp_path, unique):
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        jobs = [submit(p, "even" if i % 2 == 0 else "odd") for i in range(7)]
        pages = all_pages(p, "/v1/jobs", "jobs", "member", limit=3)
        assert [len(pg) for pg in pages] == [3, 3, 1]
        listed = [j["id"] for pg in pages for j in pg]
        newest_first = sorted(jobs, key=lambda j: (j["created_at"], j["id"]), reverse=True)
        assert listed == [j["id"] for j in newest_first]
        # a job created between pages does not shift the next page
        first = p.http.get("/v1/jobs", params={"limit": 3}, headers=p.h["member"]).json()
        submit(p, "late")
        second = p.http.get("/v1/jobs", params={"limit": 3, "cursor": first["next_cursor"]},
                            headers=p.h["member"]).json()
        assert [j["id"] for j in second["jobs"]] == listed[3:6]
        # filters
        evens = [j["id"] for pg in all_pages(p, "/v1/jobs", "jobs", "member", name="even", limit=2) for j in pg]
        assert evens == [j["id"] for j in newest_first if j["name"] == "even"]
        middle = newest_first[3]["created_at"]
        since = p.http.get("/v1/jobs", params={"since": middle, "name": "odd"}, headers=p.h["member"]).json()
        assert all(j["created_at"] >= middle and j["name"] == "odd" for j in since["jobs"]) and since["jobs"]
        until = p.http.get("/v1/jobs", params={"until": middle}, headers=p.h["member"]).json()
        assert {j["id"] for j in until["jobs"]} == {j["id"] for j in jobs if j["created_at"] < middle}
        bad = p.http.get("/v1/jobs", params={"cursor": "bm90IGEgY3Vyc29y"}, headers=p.h["member"])
        assert bad.status_code == 422 and bad.json()["error"]["details"][0]["field"] == "cursor"

        # a platform admin lists and cancels another team's job; members and team admins cannot
        beta_job = submit(p, "betas", who="beta")
        assert p.http.get("/v1/admin/teams/beta/jobs", headers=p.h["admin"]).status_code == 403
        listed = p.http.get("/v1/admin/teams/beta/jobs", headers=p.h["platform"]).json()
        assert [j["id"] for j in listed["jobs"]] == [beta_job["id"]]
        assert p.http.get("/v1/admin/teams/nope/jobs", headers=p.h["platform"]).status_code == 404
        assert p.http.post(f"/v1/admin/teams/alpha/jobs/{beta_job['id']}/cancel",
                           headers=p.h["platform"]).status_code == 404  # the team in the path scopes it
        cancelled = p.http.post(f"/v1/admin/teams/beta/jobs/{beta_job['id']}/cancel", headers=p.h["platform"])
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        assert cancelled.json()["history"][-1]["actor"].startswith("admin:")
        audit = p.http.get("/v1/admin/audit", params={"team": "beta"}, headers=p.h["platform"]).json()["entries"]
        entry = next(e for e in audit if e["route"] == "/v1/admin/teams/{team}/jobs/{job_id}/cancel"
                     and e["status"] == 200)
        assert entry["target"] == beta_job["id"] and entry["target_team"] == "beta" and entry["team"] == "ops"


def test_changed_since_lists_only_what_changed_and_as_of_misses_nothing(mongo_server, mongo_db, logstore, tmp_path,
                                                                        unique):
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        jobs = [submit(p, f"follow{i}") for i in range(4)]
        full = p.http.get("/v1/jobs", headers=p.h["member"]).json()
        assert {j["id"] for j in full["jobs"]} >= {j["id"] for j in jobs} and full["as_of"] > 0
        as_of = full["as_of"]
        time.sleep(0.3)  # past EXACT_MARGIN, so the jobs submitted before the listing are not returned again
        quiet = p.http.get("/v1/jobs", params={"changed_since": as_of}, headers=p.h["member"]).json()
        # the dispatcher may still be moving the first jobs; whatever comes back changed at or after as_of
        assert quiet["as_of"] >= as_of
        cancelled = p.http.post(f"/v1/jobs/{jobs[1]['id']}/cancel", headers=p.h["member"]).json()
        assert cancelled["state"] == "cancelled"
        changed = p.http.get("/v1/jobs", params={"changed_since": quiet["as_of"]}, headers=p.h["member"]).json()
        assert jobs[1]["id"] in [j["id"] for j in changed["jobs"]]
        assert next(j for j in changed["jobs"] if j["id"] == jobs[1]["id"])["state"] == "cancelled"
        # pages of what changed, and the admin's listing of the team takes the same parameter
        paged = all_pages(p, "/v1/jobs", "jobs", "member", changed_since=quiet["as_of"], limit=1)
        # (a job the dispatcher moved meanwhile joins them: the set only grows)
        paged_ids = [j["id"] for pg in paged for j in pg]
        assert len(paged_ids) == len(set(paged_ids)) and set(paged_ids) >= {j["id"] for j in changed["jobs"]}
        admin = p.http.get("/v1/admin/teams/alpha/jobs", params={"changed_since": quiet["as_of"]},
                           headers=p.h["platform"]).json()
        assert {j["id"] for j in admin["jobs"]} >= {j["id"] for j in changed["jobs"]} and admin["as_of"] > 0
        for bad in ("-1", "nan", "inf", "soon"):
            resp = p.http.get("/v1/jobs", params={"changed_since": bad}, headers=p.h["member"])
            assert resp.status_code == 422, (bad, resp.text)
            assert "changed_since" in json.dumps(resp.json()["error"]), resp.text


def test_audit_pages(mongo_server, mongo_db, logstore, tmp_path, unique):
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        for i in range(5):
            submit(p, f"a{i}")
        pages = all_pages(p, "/v1/admin/audit", "entries", "platform", limit=2, team="alpha")
        entries = [e for pg in pages for e in pg]
        assert [len(pg) for pg in pages] == [2, 2, 1]
        assert len({e["id"] for e in entries}) == 5
        assert [e["ts"] for e in entries] == sorted((e["ts"] for e in entries), reverse=True)
        until = entries[1]["ts"]
        older = p.http.get("/v1/admin/audit", params={"until": until, "team": "alpha"},
                           headers=p.h["platform"]).json()["entries"]
        assert {e["id"] for e in older} == {e["id"] for e in entries if e["ts"] < until}

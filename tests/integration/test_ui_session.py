"""The dashboard's server side over real HTTP: login, the session cookie, CSRF, CSP, roles and team scoping.

The API is served for real (identity and audit in the MongoDB-wire server, the
in-memory Trainer twin, as in test_api_admin.py); a plain HTTP client plays the
browser and the cross-site attacker. The browser itself is in tests/browser/.
"""

from __future__ import annotations

import re

import httpx
import pytest

from tests.integration.test_api_admin import make_platform, submit

CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')
LOGIN_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def p(mongo_db, logstore, tmp_path):
    with make_platform(mongo_db, logstore, tmp_path) as platform:
        yield platform


@pytest.fixture
def clients(p):
    """new() makes a browser-like client of the served API; all are closed at the end."""
    made: list[httpx.Client] = []

    def new() -> httpx.Client:
        made.append(httpx.Client(base_url=str(p.client.base_url), timeout=30))
        return made[-1]

    p.new_client = new
    yield new
    for c in made:
        c.close()


def login(p, who: str) -> httpx.Client:
    """A browser-like client logged in with the key `who`."""
    browser = p.new_client()
    page = browser.get("/ui/login")
    assert page.status_code == 200
    token = LOGIN_CSRF.search(page.text).group(1)
    resp = browser.post("/ui/login", data={"api_key": p.keys[who], "csrf": token})
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/jobs", resp.text
    return browser


def page_csrf(browser: httpx.Client, path: str = "/ui/jobs") -> str:
    page = browser.get(path)
    assert page.status_code == 200, page.text
    return CSRF_META.search(page.text).group(1)


def test_login_sets_a_strict_httponly_session_and_pages_carry_a_csp(p, clients):
    browser = clients()
    assert browser.get("/ui/jobs").headers["location"] == "/ui/login"  # no session: to the login page
    page = browser.get("/ui/login")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)  # no inline script
    assert not re.search(r"\son[a-z]+=", page.text)  # no inline event handler
    token = LOGIN_CSRF.search(page.text).group(1)
    bad = browser.post("/ui/login", data={"api_key": "tf_00000000_nope", "csrf": token})
    assert bad.status_code == 401 and "api_key" in bad.text and "tf_00000000_nope" not in bad.text
    token = LOGIN_CSRF.search(bad.text).group(1)
    ok = browser.post("/ui/login", data={"api_key": p.keys["alpha_member"], "csrf": token})
    cookie = ok.headers["set-cookie"]
    assert "tf_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert "Secure" not in cookie  # plain HTTP on loopback; over TLS the cookie is Secure
    jobs = browser.get("/ui/jobs")
    assert jobs.status_code == 200 and "team <strong id=\"who-team\">alpha</strong>" in jobs.text
    for path in ("/ui/static/app.js", "/ui/static/jobs.js", "/ui/static/app.css"):
        asset = browser.get(path)
        assert asset.status_code == 200 and asset.headers["content-security-policy"] == csp
    # the session reads the API as the key would
    assert browser.get("/v1/auth/me").json()["team"] == "alpha"
    assert browser.get("/v1/auth/me").json()["via"] == "jwt"


def test_login_without_the_forms_token_is_refused(p, clients):
    attacker = clients()
    resp = attacker.post("/ui/login", data={"api_key": p.keys["alpha_member"], "csrf": "forged"})
    assert resp.status_code == 403 and "tf_session" not in resp.headers.get("set-cookie", "")


def test_state_changes_need_the_csrf_token_not_just_the_cookie(p, clients):
    browser = login(p, "alpha_member")
    job = submit(p, "alpha_member")
    # a cross-site form post carries the cookie (in an old browser) but cannot know the token
    forged = browser.post(f"/v1/jobs/{job['id']}/cancel", headers={"Origin": "https://evil.example"})
    assert forged.status_code == 403 and "CSRF" in forged.json()["error"]["message"]
    wrong = browser.post(f"/v1/jobs/{job['id']}/cancel", headers={"X-CSRF-Token": "0" * 64})
    assert wrong.status_code == 403
    assert p.client.get(f"/v1/jobs/{job['id']}", headers=p.h["alpha_member"]).json()["state"] != "cancelled"
    token = page_csrf(browser)
    done = browser.post(f"/v1/jobs/{job['id']}/cancel", headers={"X-CSRF-Token": token})
    assert done.status_code == 200 and done.json()["state"] == "cancelled"
    # logout needs the token too, then the session is gone
    assert browser.post("/ui/logout", data={"csrf": "forged"}).status_code == 403
    out = browser.post("/ui/logout", data={"csrf": token})
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert browser.get("/ui/jobs").headers["location"] == "/ui/login"
    assert browser.get("/v1/jobs").status_code == 401


def test_a_revoked_keys_session_ends_on_the_next_request(p, clients):
    issued = p.client.post("/v1/team/keys", json={"name": "laptop"}, headers=p.h["alpha_admin"]).json()
    p.keys["laptop"] = issued["key"]
    browser = login(p, "laptop")
    assert browser.get("/v1/jobs").status_code == 200
    p.client.delete(f"/v1/team/keys/{issued['key_id']}", headers=p.h["alpha_admin"])
    assert browser.get("/v1/jobs").status_code == 401
    assert browser.get("/ui/jobs").headers["location"] == "/ui/login"


def test_members_never_see_admin_pages_or_other_teams_jobs(p, clients):
    member = login(p, "alpha_member")
    refused = member.get("/ui/admin")
    assert refused.status_code == 403 and "platform_admin" in refused.text and "quota-form" not in refused.text
    assert 'href="/ui/admin"' not in member.get("/ui/jobs").text
    assert member.get("/v1/admin/teams").status_code == 403
    beta_job = submit(p, "beta_member")
    assert member.get(f"/ui/jobs/{beta_job['id']}").status_code == 404
    assert member.get(f"/v1/jobs/{beta_job['id']}").status_code == 404
    assert member.get("/ui/jobs/not..an..id").status_code == 404
    own = submit(p, "alpha_member")
    assert member.get(f"/ui/jobs/{own['id']}").status_code == 200
    admin = login(p, "platform")
    page = admin.get("/ui/admin")
    assert page.status_code == 200 and 'id="quota-form"' in page.text

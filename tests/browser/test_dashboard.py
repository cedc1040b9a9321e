"""The dashboard's scenarios in headless chromium: login, live jobs, following logs, halt/resume from the
buttons, the quota editor reaching the team's page, admin pages refused to members, a hostile log line
shown as text, forged cross-site posts refused, screenshots of each page, and an axe-core scan.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.sync_api import expect

from tests.servers import free_port
from trainforge_protos import common_pb2
from trainforge_services.common.states import JobState, LearnerState

XSS = "<img src=x onerror=alert(1)>"
MANIFEST = {"name": "browser-job", "framework": "custom", "command": "python train.py", "learners": 1,
            "resources": {"cpus": 1, "memory": "1Gi"}}


def submit(platform, who: str = "member", name: str = "browser-job") -> str:
    resp = platform.http.post("/v1/jobs", data={"manifest": json.dumps({**MANIFEST, "name": name})},
                              headers=platform.h[who])
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def state_of(platform, job_id: str, who: str = "member") -> str:
    return platform.http.get(f"/v1/jobs/{job_id}", headers=platform.h[who]).json()["state"]


def test_login_live_jobs_logs_halt_resume_and_a_hostile_log_line(platform, pages, artifacts):
    page = pages(None)
    page.goto("/ui/login")
    page.screenshot(path=artifacts / "login.png", full_page=True)
    page.fill("#api_key", "tf_00000000_wrong")
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("api_key")
    page.fill("#api_key", platform.keys["member"])
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/jobs")
    expect(page.locator("#who-team")).to_have_text("alpha")

    # a job submitted through the API appears, then changes state, without a reload
    job_id = submit(platform)
    row = page.locator(f'tr[data-job="{job_id}"]')
    expect(row).to_be_visible(timeout=10_000)
    expect(row.locator(".state")).to_have_text("deploying", timeout=10_000)
    platform.report(job_id, JobState.RUNNING)
    expect(row.locator(".state")).to_have_text("running", timeout=10_000)
    page.screenshot(path=artifacts / "jobs.png", full_page=True)
    # filters: another state hides it, its name finds it
    page.select_option("#f-state", "queued")
    expect(row).to_have_count(0, timeout=10_000)
    page.select_option("#f-state", "")
    page.fill("#f-name", "browser-job")
    expect(row).to_be_visible(timeout=10_000)

    # the job page: logs follow, a hostile line is text and runs nothing
    row.locator("a").click()
    page.wait_for_url(f"**/ui/jobs/{job_id}")
    expect(page.locator("#job-state")).to_have_text("running")
    platform.log(job_id, "step 1 loss 0.9", XSS, "step 2 loss 0.7 checkpointed")
    logs = page.locator("#log-lines")
    expect(logs).to_contain_text("step 2 loss 0.7", timeout=10_000)
    platform.log(job_id, "step 3 loss 0.5")
    expect(logs).to_contain_text("step 3 loss 0.5", timeout=10_000)  # followed, no reload
    expect(logs).to_contain_text(XSS)
    assert page.locator("#log-lines img").count() == 0
    assert page.dialogs == [] and page.errors == []
    # metrics charts: one SVG line per series, drawn by our own script
    for step, loss in ((1, 0.9), (2, 0.7), (3, 0.5)):
        platform.metric(job_id, {"step": step, "loss": loss, "accuracy": 1 - loss})
    charts = page.locator("#metrics-charts figure")
    expect(charts).to_have_count(2, timeout=15_000)
    expect(page.locator("#metrics-charts figcaption")).to_have_text(["loss", "accuracy"])
    expect(page.locator("#metrics-charts svg path.series")).to_have_count(2)
    page.fill("#log-search", "checkpointed")
    expect(page.locator("#log-count")).to_have_text("1 lines matching", timeout=10_000)
    page.fill("#log-search", "")
    expect(logs).to_contain_text("step 3 loss 0.5", timeout=10_000)

    # halt and resume from the buttons; each button only where the API allows it
    expect(page.locator("#btn-resume")).to_be_disabled()
    page.click("#btn-halt")
    expect(page.locator("#job-state")).to_have_text("halting", timeout=10_000)
    assert state_of(platform, job_id) == "halting"
    platform.report(job_id, JobState.HALTED, checkpoint_step=3, learners=[
        common_pb2.LearnerStatus(rank=0, state=LearnerState.LEARNER_HALTED, exit_code=0, attempt=1, message="halted")])
    expect(page.locator("#job-state")).to_have_text("halted", timeout=10_000)
    expect(page.locator("#btn-halt")).to_be_disabled()
    expect(page.locator("#job-history")).to_contain_text("halted")
    learner = page.locator("#learners-body tr td")
    expect(learner.nth(1)).to_have_text("halted")
    expect(learner.nth(2)).to_have_text("0")  # its exit code
    page.screenshot(path=artifacts / "job-halted.png", full_page=True)
    page.click("#btn-resume")
    expect(page.locator("#job-state")).to_have_text("deploying", timeout=10_000)  # queued, then dispatched
    assert state_of(platform, job_id) == "deploying"
    platform.report(job_id, JobState.RUNNING, attempt=2, learners=[
        common_pb2.LearnerStatus(rank=0, state=LearnerState.LEARNER_RUNNING, attempt=2)])
    expect(page.locator("#job-state")).to_have_text("running", timeout=10_000)
    expect(page.locator("#learners-body tr")).to_have_count(1)
    expect(page.locator("#learners-body tr td").nth(1)).to_have_text("running")
    # outputs: listed with their checksum, downloadable with the session
    platform.output(job_id, 0, "model/weights.bin", b"\x00weights\x01")
    link = page.locator('#outputs-list a', has_text="0/model/weights.bin")
    expect(link).to_be_visible(timeout=15_000)
    download = page.request.get(link.get_attribute("href"))
    assert download.status == 200 and download.body() == b"\x00weights\x01"
    page.screenshot(path=artifacts / "job.png", full_page=True)
    assert page.dialogs == [] and page.errors == []


def test_an_admin_edits_a_quota_and_the_teams_page_shows_it(platform, pages, artifacts):
    beta_job = submit(platform, who="beta", name="beta-job")
    admin = pages("platform")
    admin.goto("/ui/admin")
    expect(admin.locator('#teams-body tr[data-team="alpha"]')).to_be_visible(timeout=10_000)
    # the cluster's running and queued jobs, every team's
    expect(admin.locator(f'#cluster-jobs tr[data-job="{beta_job}"]')).to_contain_text("deploying", timeout=10_000)
    expect(admin.locator("#cluster-totals")).to_contain_text("1 jobs")
    # the backend's capacity as the LCM reported it to the Trainer, and what is free of it
    expect(admin.locator("#cluster-capacity")).to_contain_text("Capacity (fake backend): 8 GPUs, 64 CPUs, 256Gi memory, 32 learners")
    expect(admin.locator("#cluster-capacity")).to_contain_text("free now:")
    # whether the cluster enforces NetworkPolicies, as the LCM's canary reported it with the capacity
    expect(admin.locator("#cluster-netpol")).to_have_text("NetworkPolicy: NOT enforced")
    expect(admin.locator("#quota-form[data-loaded]")).to_have_count(1, timeout=10_000)  # the page's first load
    admin.select_option("#q-team", "alpha")
    expect(admin.locator('#quota-form[data-loaded="alpha"]')).to_have_count(1, timeout=10_000)
    admin.fill("#q-gpus", "lots")
    admin.fill("#q-memory", "12 parsecs")
    admin.click("#quota-form button[type=submit]")
    errors = admin.locator("#quota-errors")
    expect(errors).to_contain_text("gpus", timeout=10_000)
    expect(errors).to_contain_text("memory")
    admin.fill("#q-gpus", "3")
    admin.fill("#q-cpus", "12")
    admin.fill("#q-memory", "16Gi")
    admin.fill("#q-jobs", "4")
    admin.click("#quota-form button[type=submit]")
    expect(admin.locator("#quota-saved")).to_have_text("Saved the quota of alpha.", timeout=10_000)
    quota = platform.http.get("/v1/admin/teams/alpha/usage", headers=platform.h["platform"]).json()["quota"]
    assert (quota["gpus"], quota["cpus"], quota["memory"], quota["jobs"]) == (3, 12.0, 16 * 2**30, 4)
    # keys: issued (shown once) and revoked
    admin.select_option("#k-team", "beta")
    admin.fill("#k-name", "ci")
    admin.click("#key-form button[type=submit]")
    expect(admin.locator("#key-issued")).to_be_visible(timeout=10_000)
    key = admin.locator("#key-value").inner_text()
    assert key.startswith("tf_") and platform.http.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    key_row = admin.locator(f'#keys-body tr[data-key="{key.split("_")[1]}"]')
    key_row.locator("button").click()
    expect(key_row).to_contain_text("revoked", timeout=10_000)
    assert platform.http.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 401
    # disable a team: its keys are refused from the next request; enable it again
    beta_row = admin.locator('#teams-body tr[data-team="beta"]')
    beta_row.locator("button").click()
    expect(beta_row).to_contain_text("disabled", timeout=10_000)
    assert platform.http.get("/v1/jobs", headers=platform.h["beta"]).status_code == 401
    beta_row.locator("button").click()
    expect(beta_row.locator("td").first).to_have_text("enabled", timeout=10_000)
    assert platform.http.get("/v1/jobs", headers=platform.h["beta"]).status_code == 200
    # the audit log, searched
    admin.fill("#a-text", "/disable")
    admin.click("#audit-form button[type=submit]")
    expect(admin.locator("#audit-body tr")).to_have_count(1, timeout=10_000)
    expect(admin.locator("#audit-body")).to_contain_text("POST /v1/admin/teams/beta/disable")
    admin.screenshot(path=artifacts / "admin.png", full_page=True)

    member = pages("member")
    member.goto("/ui/team")
    gpus = member.locator('#quota-body tr[data-resource="GPUs"] .quota')
    expect(gpus).to_have_text("3", timeout=10_000)
    expect(member.locator('#quota-body tr[data-resource="Memory"] .quota')).to_have_text("16Gi")
    member.screenshot(path=artifacts / "team.png", full_page=True)

    # a member is refused the admin pages, and has no link to them
    expect(member.locator('a[href="/ui/admin"]')).to_have_count(0)
    resp = member.goto("/ui/admin")
    assert resp.status == 403
    expect(member.locator("#page-error")).to_contain_text("platform_admin")
    assert member.locator("#quota-form").count() == 0
    member.screenshot(path=artifacts / "admin-refused.png", full_page=True)
    status = member.evaluate("fetch('/v1/admin/teams').then(r => r.status)")
    assert status == 403


class _Evil(BaseHTTPRequestHandler):
    """Another site: its page posts a form to the dashboard's API, as a CSRF attack would."""

    target = ""

    def do_GET(self):  # noqa: N802 - the handler's name is the protocol's
        body = (f'<html><body><form id="f" method="post" action="{self.target}"><input name="x" value="1"></form>'
                '<script>document.getElementById("f").submit()</script></body></html>').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_forged_cross_site_posts_are_refused(platform, pages):
    page = pages("member")
    job_id = submit(platform)
    target = f"{platform.url}/v1/jobs/{job_id}/cancel"
    handler = type("Evil", (_Evil,), {"target": target})
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        # another site (localhost is not 127.0.0.1's site): the form post is answered without a session
        with page.expect_response(target) as answer:
            page.goto(f"http://localhost:{server.server_address[1]}/")
        assert answer.value.status in (401, 403)
        assert state_of(platform, job_id) != "cancelled"
        # even from our own origin, a post without the page's CSRF token is refused (SameSite is not enough)
        page.goto("/ui/jobs")
        status = page.evaluate(f"fetch('/v1/jobs/{job_id}/cancel', {{method: 'POST'}}).then(r => r.status)")
        assert status == 403
        assert state_of(platform, job_id) != "cancelled"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("who", ["member", "platform"])
def test_pages_have_no_serious_accessibility_violations(platform, pages, artifacts, who):
    from axe_playwright_python.sync_playwright import Axe

    job_id = submit(platform, who="member" if who == "member" else "member")
    platform.report(job_id, JobState.RUNNING)
    page = pages(who)
    paths = ["/ui/jobs", "/ui/team"] + ([f"/ui/jobs/{job_id}"] if who == "member" else ["/ui/admin"])
    axe = Axe()
    found = {}
    for path in paths:
        page.goto(path)
        page.wait_for_load_state("networkidle")
        results = axe.run(page)
        bad = [v for v in results.response["violations"] if v.get("impact") in ("serious", "critical")]
        if bad:
            found[path] = [(v["id"], v["help"], [n["target"] for n in v["nodes"]][:3]) for v in bad]
        page.screenshot(path=artifacts / (path.strip("/").replace("/", "-") + ".png"), full_page=True)
    login = pages(None)
    login.goto("/ui/login")
    bad = [v["id"] for v in axe.run(login).response["violations"] if v.get("impact") in ("serious", "critical")]
    if bad:
        found["/ui/login"] = bad
    assert found == {}

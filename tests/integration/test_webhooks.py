"""Webhook notifications end to end: API -> real Trainer (MongoDB) -> a real HTTP receiver on loopback.

The receiver answers 500 twice before it accepts; it still gets exactly one
accepted, correctly signed delivery per terminal event, the same delivery id
on every try, each try recorded in the job's notifications. A Trainer that
stops with a delivery pending hands it to the next one through the outbox.
A receiver on loopback is reached only because TF_WEBHOOK_ALLOW names it
(`platform(allow=...)`); other loopback destinations, names resolving to
them and the API's own port are refused when set, at submit, and at
delivery.
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx
import pytest

from tests.fakes.lcm import IdleLcm
from tests.servers import free_port, serve_app, wait_for
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.api.trainer_client import TrainerClient
from trainforge_services.common import rpcauth
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings, TrainerSettings
from trainforge_services.common.webhooks import DELIVERY_HEADER, SIGNATURE_HEADER, verify
from trainforge_services.trainer.resources import Usage
from trainforge_services.trainer.wiring import serve


class Receiver:
    """An HTTP server that answers each POST to a path with the next status of `plan[path]` (then 200)."""

    def __init__(self, plan: dict[str, list[int]]):
        self.plan = {path: list(statuses) for path, statuses in plan.items()}
        self.got: list[SimpleNamespace] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    statuses = receiver.plan.get(self.path) or []
                    status = statuses.pop(0) if statuses else 200
                    receiver.got.append(SimpleNamespace(path=self.path, headers=dict(self.headers), body=body,
                                                        status=status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.hostport = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"http://{self.hostport}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def accepted(self, path: str | None = None) -> list[SimpleNamespace]:
        with self.lock:
            return [g for g in self.got if g.status == 200 and (path is None or g.path == path)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def platform(mongo_server, mongo_db, logstore, tmp_path, unique, allow: str = "", api_port: int | None = None):
    """A Trainer and an API; `allow` is both services' TF_WEBHOOK_ALLOW, `api_port` the API's own port."""
    api_port = api_port or free_port()
    settings = TrainerSettings(state_dir=tmp_path, dev_mode=True, mongo_url=mongo_server.url, mongo_db=mongo_db.name,
                               trainer_address="127.0.0.1:0", dispatch_interval=0.2, webhook_backoff=0.05,
                               webhook_allow=allow, api_address=f"127.0.0.1:{api_port}")
    trainer = serve(settings, lcm=IdleLcm(Usage(0, 4, 64 * 2**30, 8)), db=mongo_db, collection=f"jobs_{unique}")
    identity = IdentityStore(mongo_db, touch_interval=0)
    identity.create_team("alpha")
    identity.create_team("beta")
    identity.create_team("ops")
    keys = {"platform": identity.issue_key("ops", "root", Role.PLATFORM_ADMIN),"member": identity.issue_key("alpha", "m", Role.MEMBER),
            "admin": identity.issue_key("alpha", "a", Role.TEAM_ADMIN),
            "beta": identity.issue_key("beta", "b", Role.MEMBER)}
    client = TrainerClient(trainer.address, authorization=rpcauth.service_authorization(settings))
    app = create_app(ApiSettings(dev_mode=True, state_dir=tmp_path, webhook_allow=allow, api_port=api_port),
                     trainer=client, identity=identity,
                     logs=logstore, objects=LocalStore(tmp_path / "objects"))
    try:
        with serve_app(app, port=api_port) as url, httpx.Client(base_url=url, timeout=30) as http:
            yield SimpleNamespace(http=http, trainer=trainer, settings=settings, url=url, keys=keys,
                                  h={k: {"Authorization": f"Bearer {v}"} for k, v in keys.items()})
    finally:
        client.close()
        trainer.stop(0)


@pytest.fixture
def receiver():
    r = Receiver({"/job": [500, 500]})
    yield r
    r.close()


def submit(p, webhook: str | None) -> str:
    manifest = {"name": "hooked", "framework": "custom", "command": "true"}
    if webhook:
        manifest["notify"] = {"webhook": webhook}
    resp = p.http.post("/v1/jobs", data={"manifest": json.dumps(manifest)}, headers=p.h["member"])
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def test_one_signed_delivery_per_terminal_event_even_after_two_failures(mongo_server, mongo_db, logstore, tmp_path,
                                                                         unique, receiver):
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique, allow=receiver.hostport) as p:
        team = p.http.put("/v1/team/notifications", json={"webhook": f"{receiver.url}/team"}, headers=p.h["admin"])
        assert team.status_code == 200, team.text
        secret = team.json()["signing_secret"]
        job_id = submit(p, f"{receiver.url}/job")
        assert p.http.post(f"/v1/jobs/{job_id}/cancel", headers=p.h["member"]).json()["state"] == "cancelled"

        def delivered():
            deliveries = p.http.get(f"/v1/jobs/{job_id}/notifications", headers=p.h["member"]).json()["deliveries"]
            return deliveries if len(deliveries) == 2 and all(d["status"] == "delivered" for d in deliveries) else None

        deliveries = wait_for(delivered, 30, "both deliveries")
        # the first target to be tried got the two failures: 3 tries, every one recorded
        assert sorted(d["tries"] for d in deliveries) == [1, 3]
        retried = next(d for d in deliveries if d["tries"] == 3)
        assert [a["status_code"] for a in retried["attempts"]] == [500, 500, 200]
        for path in ("/job", "/team"):
            accepted = receiver.accepted(path)
            assert len(accepted) == 1, path
            got = accepted[0]
            assert verify(secret, got.body, got.headers[SIGNATURE_HEADER])
            assert not verify("wrong", got.body, got.headers[SIGNATURE_HEADER])
            event = json.loads(got.body)
            assert event["event"] == "job.cancelled" and event["job"]["id"] == job_id
        # every try of one delivery carries the same id, for receivers that deduplicate
        assert retried["url"].endswith("/job")
        assert len({g.headers[DELIVERY_HEADER] for g in receiver.got if g.path == "/job"}) == 1
        # another team does not see them; platform admins see every team's
        assert p.http.get(f"/v1/jobs/{job_id}/notifications", headers=p.h["beta"]).status_code == 404
        listed = p.http.get("/v1/admin/notifications", params={"team": "alpha"}, headers=p.h["platform"]).json()
        assert {d["id"] for d in listed["deliveries"]} == {d["id"] for d in deliveries}
        assert p.http.get("/v1/admin/notifications", headers=p.h["admin"]).status_code == 403
        assert secret not in json.dumps(listed)
        # a second terminal event cannot happen (cancelled is final): nothing more arrives
        assert p.http.post(f"/v1/jobs/{job_id}/cancel", headers=p.h["member"]).status_code == 200
        assert len(receiver.accepted()) == 2 and len(receiver.got) == 4


def test_a_pending_delivery_survives_a_trainer_restart(mongo_server, mongo_db, logstore, tmp_path, unique):
    down = Receiver({"/x": [503] * 1000})  # refuses everything while the first Trainer runs
    try:
        with platform(mongo_server, mongo_db, logstore, tmp_path, unique, allow=down.hostport) as p:
            job_id = submit(p, f"{down.url}/x")
            p.http.post(f"/v1/jobs/{job_id}/cancel", headers=p.h["member"])
            wait_for(lambda: len(down.got) >= 2, 30, "the receiver to be tried")
        # the first Trainer is gone with the delivery pending; the receiver now accepts
        with down.lock:
            down.plan.clear()
        with platform(mongo_server, mongo_db, logstore, tmp_path, unique, allow=down.hostport) as p:
            wait_for(lambda: down.accepted(), 30, "the delivery after the restart")
            deliveries = p.http.get(f"/v1/jobs/{job_id}/notifications", headers=p.h["member"]).json()["deliveries"]
            assert len(deliveries) == 1 and deliveries[0]["status"] == "delivered"
            assert len(down.accepted()) == 1
    finally:
        down.close()


def test_the_cli_sets_the_team_webhook_and_shows_a_jobs_deliveries(mongo_server, mongo_db, logstore, tmp_path, unique,
                                                                   receiver):
    from click.testing import CliRunner

    from trainforge import cli

    with platform(mongo_server, mongo_db, logstore, tmp_path, unique, allow=receiver.hostport) as p:
        def run(who, *args):
            env = {"TF_STATE_DIR": str(tmp_path / "cli"), "TRAINFORGE_API_URL": p.url, "TRAINFORGE_API_KEY": p.keys[who]}
            result = CliRunner().invoke(cli.main, list(args), env=env, catch_exceptions=False)
            assert result.exit_code == 0, result.output
            return json.loads(result.stdout)

        hook = run("admin", "webhook", "set", f"{receiver.url}/team", "--json")
        assert hook["webhook"] == f"{receiver.url}/team" and hook["signing_secret"].startswith("whsec_")
        job_id = submit(p, None)
        p.http.post(f"/v1/jobs/{job_id}/cancel", headers=p.h["member"])
        wait_for(lambda: receiver.accepted("/team"), 30, "the delivery")
        shown = wait_for(lambda: [d for d in run("member", "notifications", job_id, "--json")["deliveries"]
                                  if d["status"] == "delivered"], 30, "the delivery to be recorded")
        assert shown[0]["event"]["type"] == "job.cancelled"


def test_destinations_in_the_platforms_network_are_refused_when_set_and_at_submit(mongo_server, mongo_db, logstore,
                                                                                   tmp_path, unique, receiver):
    # 127.0.0.1 is allowed without a port: the receiver is reached, the API's own port still is not
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique, allow="127.0.0.1") as p:
        api_port = int(p.url.rsplit(":", 1)[1])
        refused = {
            "http://[::1]:9/": "loopback", f"http://localhost:{api_port}/hook": "the platform's own services",
            "http://169.254.169.254/latest/meta-data/": "link-local", "http://0.0.0.0:9/": "unspecified",
            f"http://127.0.0.1:{api_port}/v1/jobs": "the platform's own services",
            f"http://127.1:{api_port}/": "the platform's own services",  # a name resolving to 127.0.0.1
        }
        for url, rule in refused.items():
            put = p.http.put("/v1/team/notifications", json={"webhook": url}, headers=p.h["admin"])
            assert put.status_code == 422 and rule in put.json()["error"]["message"], (url, put.text)
            manifest = {"name": "hooked", "framework": "custom", "command": "true", "notify": {"webhook": url}}
            post = p.http.post("/v1/jobs", data={"manifest": json.dumps(manifest)}, headers=p.h["member"])
            assert post.status_code == 422, (url, post.text)
            assert post.json()["error"]["message"].startswith("notify.webhook: ") and rule in post.text, post.text
        assert p.http.put("/v1/team/notifications", json={"webhook": f"{receiver.url}/team"},
                          headers=p.h["admin"]).status_code == 200
        # each refusal is in the audit log with the team, the key and the source
        entries = p.http.get("/v1/admin/audit", params={"team": "alpha"}, headers=p.h["platform"]).json()["entries"]
        refusals = [e for e in entries if e.get("refused")]
        assert len(refusals) == 2 * len(refused), entries
        sources = {r["source"] for e in refusals for r in e["refused"]}
        assert sources == set(refused)
        submitted = next(e for e in refusals if e["route"] == "/v1/jobs")
        assert submitted["team"] == "alpha" and submitted["key_id"] and submitted["status"] == 422
        assert submitted["refused"][0]["field"] == "notify.webhook"


def test_a_delivery_to_a_destination_refused_now_fails_at_once_with_why(mongo_server, mongo_db, logstore, tmp_path,
                                                                        unique, receiver):
    from trainforge_services.common.secrets import SecretBox, load_key
    from trainforge_services.common.webhooks import TeamWebhooks

    with platform(mongo_server, mongo_db, logstore, tmp_path, unique, allow=receiver.hostport) as p:
        api_port = int(p.url.rsplit(":", 1)[1])
        # a default stored before the rule (the store takes it as it is): the delivery checks it again
        hooks = TeamWebhooks(mongo_db, SecretBox(load_key("", dev_mode=True, state_dir=tmp_path)))
        hooks.set_default("alpha", f"http://localhost:{api_port}/v1/jobs")
        job_id = submit(p, f"{receiver.url}/job")
        p.http.post(f"/v1/jobs/{job_id}/cancel", headers=p.h["member"])

        def settled():
            deliveries = p.http.get(f"/v1/jobs/{job_id}/notifications", headers=p.h["member"]).json()["deliveries"]
            return deliveries if len(deliveries) == 2 and all(d["status"] in ("delivered", "failed")
                                                              for d in deliveries) else None

        deliveries = {d["url"]: d for d in wait_for(settled, 30, "both deliveries to settle")}
        refused = deliveries[f"http://localhost:{api_port}/v1/jobs"]
        assert refused["status"] == "failed" and refused["tries"] == 1, refused
        assert "own services" in refused["refused"] or "loopback" in refused["refused"], refused
        assert refused["attempts"][0]["error"].startswith("refused: webhook: localhost:")
        assert refused["attempts"][0]["status_code"] is None
        assert deliveries[f"{receiver.url}/job"]["status"] == "delivered"
        listed = p.http.get("/v1/admin/notifications", params={"status": "failed"}, headers=p.h["platform"]).json()
        assert [d["id"] for d in listed["deliveries"]] == [refused["id"]]


def test_the_delivery_connects_to_the_address_it_checked(mongo_db, unique):
    """A name that resolves to an allowed address and a moment later to another (DNS rebinding) is resolved
    once: the POST goes to the checked address, with the name in Host."""
    from trainforge_services.common.destinations import policy
    from trainforge_services.common.webhooks import Outbox, TeamWebhooks
    from trainforge_services.trainer.notifier import Notifier

    receiver = Receiver({})
    port = int(receiver.hostport.rsplit(":", 1)[1])
    answers = iter([["127.0.0.1"], ["169.254.169.254"], ["169.254.169.254"]])
    asked: list[str] = []

    def rebinding(host: str, _: int) -> list[str]:
        asked.append(host)
        return next(answers)

    outbox = Outbox(mongo_db, f"outbox_{unique}")
    hooks = TeamWebhooks(mongo_db, lambda: None, f"hooks_{unique}")
    hooks.signing_secret = lambda team: "s3cret"  # no secrets box needed for this one
    notifier = Notifier(outbox, hooks, policy=policy(receiver.hostport, [], resolve=rebinding))
    outbox.enqueue(job_id="j-1", team="alpha", event={"seq": 1, "type": "job.completed"},
                   url=f"http://hook.example:{port}/job", payload=b"{}")
    assert notifier.deliver_one()
    assert asked == ["hook.example"]
    got = receiver.accepted("/job")
    assert len(got) == 1 and got[0].headers["Host"] == f"hook.example:{port}"
    # the same name now resolving to the metadata address is refused, and not retried
    outbox.enqueue(job_id="j-1", team="alpha", event={"seq": 2, "type": "job.failed"},
                   url=f"http://hook.example:{port}/job", payload=b"{}")
    assert notifier.deliver_one() and not notifier.deliver_one()
    failed = [d for d in outbox.for_job("j-1") if d["status"] == "failed"]
    assert len(failed) == 1 and "link-local" in failed[0]["refused"] and failed[0]["tries"] == 1
    assert len(receiver.accepted("/job")) == 1
    receiver.close()

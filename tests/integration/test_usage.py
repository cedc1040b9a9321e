"""Per-day usage accounting over REST, CSV, the SDK and the CLI, against a real Trainer and its MongoDB store.

Jobs are submitted through the API to a real Trainer (an idle LCM double, so
nothing runs); their state and status history are then rewritten in the real
job store with chosen timestamps, so every figure is known to the second —
a job spanning midnight, one halted and resumed, one that started before the
window, one never admitted, and one still running at the query time.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import time
from types import SimpleNamespace

import httpx
from click.testing import CliRunner

from tests.fakes.lcm import IdleLcm
from tests.servers import serve_app, wait_for
from trainforge import cli
from trainforge.sdk import Client
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.api.trainer_client import TrainerClient
from trainforge_services.common import rpcauth
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings, TrainerSettings
from trainforge_services.common.states import JobState
from trainforge_services.trainer.resources import Usage
from trainforge_services.trainer.wiring import serve

DAY = 86400
# two whole days before today (UTC), so the running job's third day is today
T0 = (int(time.time()) // DAY - 2) * DAY
S = JobState
# what a stint borrowed in its team's cohort, as the Trainer writes it on the entry that reserved it
CPU = {"gpus": 0, "cpus": 1.0, "memory": 0}
GPU = {"gpus": 1, "cpus": 0.0, "memory": 0}
ZERO = {"borrowed_gpu_seconds": 0, "borrowed_cpu_seconds": 0}


@contextlib.contextmanager
def platform(mongo_server, mongo_db, logstore, tmp_path, unique):
    collection = f"jobs_{unique}"
    settings = TrainerSettings(state_dir=tmp_path, dev_mode=True, mongo_url=mongo_server.url, mongo_db=mongo_db.name,
                               trainer_address="127.0.0.1:0", dispatch_interval=0.2)
    trainer = serve(settings, lcm=IdleLcm(Usage(64, 256, 2**40, 64)), db=mongo_db, collection=collection)
    identity = IdentityStore(mongo_db, touch_interval=0)
    for team in ("alpha", "beta", "ops"):
        identity.create_team(team)
    keys = {"platform": identity.issue_key("ops", "root", Role.PLATFORM_ADMIN),
            "alpha": identity.issue_key("alpha", "a", Role.MEMBER), "beta": identity.issue_key("beta", "b", Role.MEMBER)}
    client = TrainerClient(trainer.address, authorization=rpcauth.service_authorization(settings))
    app = create_app(ApiSettings(dev_mode=True, state_dir=tmp_path), trainer=client, identity=identity,
                     logs=logstore, objects=LocalStore(tmp_path / "objects"))
    try:
        with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as http:
            yield SimpleNamespace(http=http, url=url, keys=keys, jobs=mongo_db[collection],
                                  h={k: {"Authorization": f"Bearer {v}"} for k, v in keys.items()})
    finally:
        client.close()
        trainer.stop(0)


def submit(p, who: str, name: str, learners: int = 1, **resources) -> str:
    manifest = {"name": name, "framework": "custom", "command": "true", "learners": learners, "resources": resources}
    resp = p.http.post("/v1/jobs", data={"manifest": json.dumps(manifest)}, headers=p.h[who])
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def seed(p, job_id: str, created: float, steps: list[tuple]) -> None:
    """Give the job this history (from PENDING at `created`) and the last step's state, in the real store.

    A step is (state, time) or (state, time, extra): extra is {"borrowed": ...} (what the stint it starts
    borrowed in the cohort) and/or {"grown": ...} (a grant's entry: all held beyond the minimum from then on)."""
    # the dispatcher must be done with the job before its record is rewritten under it
    wait_for(lambda: p.jobs.find_one({"_id": job_id})["state"] == int(S.DEPLOYING), 20, f"{job_id} deploying")
    history, frm = {}, S.PENDING
    for i, (to, ts, *extra) in enumerate([(S.QUEUED, created), *steps]):
        more = extra[0] if extra else {}
        more = more if "grown" in more or "borrowed" in more else {"borrowed": more} if more else {}
        history[f"{int(ts * 1e9):020d}{i:04x}"] = {"from": int(frm), "to": int(to), "reason": "seeded",
                                                   "actor": "test", "ts": ts, **more}
        frm = to
    p.jobs.update_one({"_id": job_id}, {"$set": {"history": history, "state": int(frm), "created_at": created,
                                                 "updated_at": steps[-1][1] if steps else created}})


def seed_jobs(p) -> dict[str, str]:
    d1, d2, d3 = T0, T0 + DAY, T0 + 2 * DAY
    jobs = {
        # day 1, 01:00-... : 3620 s active, 2 learners x (1 a100, 2 cpus, 1 GiB)
        "a": submit(p, "alpha", "two-a100", learners=2, gpus=1, gpu_type="a100", cpus=2, memory="1Gi"),
        # across midnight, halted and resumed: 300 s on day 1, 600 + 200 s on day 2; 1 cpu, 2 GiB; the resumed
        # stint (200 s) on a CPU borrowed in the cohort
        "b": submit(p, "alpha", "halted", cpus=1, memory="2Gi"),
        # started before the window: only its 500 s inside day 1 count; 1 untyped GPU, 1 cpu, 1 GiB
        "c": submit(p, "beta", "early", gpus=1, cpus=1, memory="1Gi"),
        # cancelled while queued: a submission, no usage
        "d": submit(p, "beta", "cancelled", cpus=1),
        # still running at query time since day 2 + 3700 s; 1 untyped GPU, 0.5 cpu, 4 GiB; its GPU borrowed
        "e": submit(p, "beta", "long", gpus=1, cpus=0.5, memory="4Gi"),
    }
    seed(p, jobs["a"], d1 + 3600, [(S.DEPLOYING, d1 + 7200), (S.RUNNING, d1 + 7210), (S.STORING, d1 + 10810),
                                   (S.COMPLETED, d1 + 10820)])
    seed(p, jobs["b"], d1 + 86000, [(S.DEPLOYING, d1 + 86100), (S.RUNNING, d1 + 86110), (S.HALTING, d2 + 500),
                                    (S.HALTED, d2 + 600), (S.QUEUED, d2 + 1000), (S.DEPLOYING, d2 + 1100, CPU),
                                    (S.RUNNING, d2 + 1150), (S.FAILED, d2 + 1300)])
    seed(p, jobs["c"], d1 - 2000, [(S.DEPLOYING, d1 - 500), (S.RUNNING, d1 - 400), (S.COMPLETED, d1 + 500)])
    seed(p, jobs["d"], d2 + 10, [(S.CANCELLED, d2 + 20)])
    seed(p, jobs["e"], d2 + 3600, [(S.DEPLOYING, d2 + 3700, GPU), (S.RUNNING, d2 + 3710)])
    assert d3 <= time.time()
    return jobs


def day(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def test_usage_per_team_per_day_matches_seeded_histories_to_the_second(mongo_server, mongo_db, logstore, tmp_path,
                                                                        unique):
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        seed_jobs(p)
        resp = p.http.get("/v1/admin/usage", params={"since": T0, "until": T0 + 2 * DAY, "group_by": "day"},
                          headers=p.h["platform"])
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert {t["team"] for t in body["teams"]} >= {"alpha", "beta"}  # the running totals are still there
        report = body["accounting"]
        assert (report["since"], report["until"], report["group_by"]) == (T0, T0 + 2 * DAY, "day")
        rows = {(r["day"], r["team"]): r for r in report["days"]}
        d1, d2 = day(T0), day(T0 + DAY)
        assert rows == {
            (d1, "alpha"): {"day": d1, "team": "alpha", "gpu_seconds": 7240, "gpu_seconds_by_type": {"a100": 7240},
                            "cpu_seconds": 3620 * 4 + 300, "memory_gib_seconds": 3620 * 2 + 300 * 2,
                            "jobs_active": 2, "jobs_submitted": 2, **ZERO},
            (d2, "alpha"): {"day": d2, "team": "alpha", "gpu_seconds": 0, "gpu_seconds_by_type": {},
                            "cpu_seconds": 800, "memory_gib_seconds": 1600, "jobs_active": 1, "jobs_submitted": 0,
                            "borrowed_gpu_seconds": 0, "borrowed_cpu_seconds": 200},
            (d1, "beta"): {"day": d1, "team": "beta", "gpu_seconds": 500, "gpu_seconds_by_type": {"unspecified": 500},
                           "cpu_seconds": 500, "memory_gib_seconds": 500, "jobs_active": 1, "jobs_submitted": 0,
                           **ZERO},
            # the running job counts up to `until`
            (d2, "beta"): {"day": d2, "team": "beta", "gpu_seconds": DAY - 3700,
                           "gpu_seconds_by_type": {"unspecified": DAY - 3700}, "cpu_seconds": (DAY - 3700) / 2,
                           "memory_gib_seconds": (DAY - 3700) * 4, "jobs_active": 1, "jobs_submitted": 2,
                           "borrowed_gpu_seconds": DAY - 3700, "borrowed_cpu_seconds": 0},
        }

        # no `until`: the running job counts up to now, today included
        before = time.time()
        live = p.http.get("/v1/admin/usage", params={"since": day(T0 + DAY)}, headers=p.h["platform"]).json()
        after = time.time()
        # today, not T0 + 2 days: T0 is taken when the module is imported, and a run may cross midnight after it
        midnight = int(before) // DAY * DAY
        today = {r["team"]: r for r in live["accounting"]["days"] if r["day"] == day(midnight)}
        assert set(today) == {"beta"}
        assert before - midnight - 1 <= today["beta"]["gpu_seconds"] <= after - midnight + 1
        assert abs(today["beta"]["memory_gib_seconds"] - today["beta"]["gpu_seconds"] * 4) < 0.01  # one job
        assert before - 1 <= live["accounting"]["until"] <= after + 1


def test_an_elastic_jobs_grants_are_charged_per_day_and_split_at_midnight(mongo_server, mongo_db, logstore,
                                                                          tmp_path, unique):
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        manifest = {"name": "elastic", "framework": "torch", "command": "python train.py",
                    "learners": {"min": 1, "max": 3}, "resources": {"gpus": 1, "cpus": 2, "memory": "1Gi"}}
        resp = p.http.post("/v1/jobs", data={"manifest": json.dumps(manifest)}, headers=p.h["alpha"])
        assert resp.status_code == 201, resp.text
        d1, d2 = T0, T0 + DAY
        two = {"grown": {"gpus": 2, "cpus": 4.0, "memory": 2 * 2**30}}  # 2 learners beyond the minimum
        # 1 learner from 10:00, 3 from 12:00 (mid-day) until requeued at 23:03:20 (restarting still holds them);
        # reserved again at 23:30 at its minimum,
        # granted 2 more at 23:50, across midnight until 00:20 on day 2
        seed(p, resp.json()["id"], d1 + 35000, [(S.DEPLOYING, d1 + 36000), (S.RUNNING, d1 + 36010),
                                                (S.RUNNING, d1 + 43200, two), (S.RESTARTING, d1 + 82800),
                                                (S.QUEUED, d1 + 83000), (S.DEPLOYING, d1 + 84600),
                                                (S.RUNNING, d1 + 84610), (S.RUNNING, d1 + 85800, two),
                                                (S.COMPLETED, d2 + 1200)])
        report = p.http.get("/v1/admin/usage", params={"since": d1, "until": d1 + 2 * DAY},
                            headers=p.h["platform"]).json()["accounting"]
        rows = {r["day"]: r for r in report["days"] if r["team"] == "alpha"}
        first = (43200 - 36000) + 3 * (83000 - 43200) + (85800 - 84600) + 3 * (DAY - 85800)
        assert rows[day(d1)]["gpu_seconds"] == first and rows[day(d1)]["cpu_seconds"] == 2 * first
        assert rows[day(d1)]["memory_gib_seconds"] == first
        assert rows[day(d2)]["gpu_seconds"] == 3 * 1200 and rows[day(d2)]["cpu_seconds"] == 6 * 1200
        assert rows[day(d1)]["borrowed_gpu_seconds"] == rows[day(d2)]["borrowed_gpu_seconds"] == 0
        # the REST history shows the grants
        job = p.http.get(f"/v1/jobs/{resp.json()['id']}", headers=p.h["alpha"]).json()
        assert [e["grown"]["gpus"] for e in job["history"] if e.get("grown")] == [2, 2]


def test_usage_csv_sdk_and_cli_give_the_same_figures(mongo_server, mongo_db, logstore, tmp_path, unique):
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        seed_jobs(p)
        window = {"since": day(T0), "until": day(T0 + 2 * DAY)}  # dates: their UTC midnights
        resp = p.http.get("/v1/admin/usage.csv", params=window, headers=p.h["platform"])
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("text/csv")
        assert resp.headers["content-disposition"].startswith("attachment; filename=")
        text = resp.text
        assert text.endswith("\r\n") and "\r\n" in text.rstrip("\r\n")  # RFC 4180 line ends
        table = list(csv.DictReader(io.StringIO(text, newline="")))
        assert list(table[0]) == ["day", "team", "gpu_seconds", "cpu_seconds", "memory_gib_seconds", "jobs_active",
                                  "jobs_submitted", "borrowed_gpu_seconds", "borrowed_cpu_seconds",
                                  "gpu_seconds:a100", "gpu_seconds:unspecified"]
        by_key = {(r["day"], r["team"]): r for r in table}
        assert by_key[(day(T0), "alpha")]["gpu_seconds:a100"] == "7240"
        assert by_key[(day(T0), "alpha")]["cpu_seconds"] == str(3620 * 4 + 300)
        assert by_key[(day(T0 + DAY), "beta")]["cpu_seconds"] == str((DAY - 3700) // 2)
        assert by_key[(day(T0), "beta")]["gpu_seconds:unspecified"] == "500"
        assert by_key[(day(T0 + DAY), "beta")]["borrowed_gpu_seconds"] == str(DAY - 3700)
        assert by_key[(day(T0 + DAY), "alpha")]["borrowed_cpu_seconds"] == "200"
        same = p.http.get("/v1/admin/usage", params={**window, "format": "csv"}, headers=p.h["platform"])
        assert same.text == text

        sdk = Client(p.url, p.keys["platform"])
        try:
            assert sdk.admin.usage_csv(**window) == text
            report = sdk.admin.usage_report(**window)
            assert {(r["day"], r["team"]): r["cpu_seconds"] for r in report["days"]} == {
                k: float(r["cpu_seconds"]) for k, r in by_key.items()}
        finally:
            sdk.close()

        env = {"TF_STATE_DIR": str(tmp_path / "cli"), "TRAINFORGE_API_URL": p.url,
               "TRAINFORGE_API_KEY": p.keys["platform"]}
        got = CliRunner().invoke(cli.main, ["admin", "usage", "--since", window["since"], "--until", window["until"],
                                            "--csv"], env=env, catch_exceptions=False)
        assert got.exit_code == 0, got.output
        assert got.stdout_bytes == text.encode()  # byte for byte, CRLF kept
        beta = CliRunner().invoke(cli.main, ["admin", "usage", "beta", "--since", window["since"], "--until",
                                             window["until"], "--json"], env=env, catch_exceptions=False)
        assert beta.exit_code == 0, beta.output
        assert {r["team"] for r in json.loads(beta.stdout)["days"]} == {"beta"}
        table = CliRunner().invoke(cli.main, ["admin", "usage", "beta", "--since", window["since"], "--until",
                                              window["until"]], env={**env, "COLUMNS": "200"}, catch_exceptions=False)
        assert table.exit_code == 0, table.output
        header, *lines = [[c.strip() for c in re.split("[┃│]", ln)] for ln in table.stdout.splitlines()
                          if ln.strip() and "━" not in ln and "─" not in ln]
        assert header[2:4] == ["gpu hours", "borrowed gpu h"] and header[6] == "borrowed cpu h", header
        assert [ln[2:4] for ln in lines if ln[0] == day(T0 + DAY)] == [[f"{(DAY - 3700) / 3600:.2f}"] * 2]


def test_usage_parameters_are_validated_and_admin_only(mongo_server, mongo_db, logstore, tmp_path, unique):
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        def field_of(params: dict, path: str = "/v1/admin/usage") -> str:
            resp = p.http.get(path, params=params, headers=p.h["platform"])
            assert resp.status_code == 422, resp.text
            return resp.json()["error"]["details"][0]["field"]

        assert field_of({"since": "yesterday"}) == "since"
        assert field_of({"since": T0, "until": "soon"}) == "until"
        assert field_of({"since": T0, "until": T0 - 1}) == "until"
        assert field_of({"since": T0, "group_by": "week"}) == "group_by"
        assert field_of({"since": T0, "format": "xlsx"}) == "format"
        assert field_of({"until": T0}) == "since"
        assert field_of({}, "/v1/admin/usage.csv") == "since"
        assert field_of({"since": T0 - 400 * DAY}) == "until"
        for path in ("/v1/admin/usage", "/v1/admin/usage.csv"):
            assert p.http.get(path, params={"since": T0}, headers=p.h["alpha"]).status_code == 403
            assert p.http.get(path, params={"since": T0}).status_code == 401

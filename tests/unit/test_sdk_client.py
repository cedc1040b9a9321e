"""The SDK against the real API app (in-memory Trainer, real identity and log stores) over HTTP."""

from __future__ import annotations

import datetime as dt
import io
import tarfile
import threading
import time
from types import SimpleNamespace

import pytest

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.servers import free_port, serve_app, wait_for
from trainforge.sdk import ApiError, Client, ClientError, WaitTimeout, pack_code
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.common.adapters.logstore import LogLine
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings
from trainforge_services.common.states import JobState

TO_COMPLETED = (JobState.DEPLOYING, JobState.RUNNING, JobState.STORING, JobState.COMPLETED)


@pytest.fixture
def platform(mongo_db, logstore, tmp_path):
    identity = IdentityStore(mongo_db)
    identity.create_team("alpha")
    key = identity.issue_key("alpha", "sdk", Role.MEMBER)
    trainer = InMemoryTrainer()
    objects = LocalStore(tmp_path / "objects")
    app = create_app(ApiSettings(dev_mode=True), trainer=trainer, identity=identity, logs=logstore, objects=objects)
    with serve_app(app) as url, Client(url, key, timeout=10) as client:
        yield SimpleNamespace(client=client, url=url, key=key, trainer=trainer, objects=objects, logs=logstore)


def write_project(root):
    (root / "src" / "__pycache__").mkdir(parents=True)
    (root / "src" / ".git").mkdir()
    (root / "src" / "train.py").write_text("print('train')\n")
    (root / "src" / "lib").mkdir()
    (root / "src" / "lib" / "util.py").write_text("X = 1\n")
    (root / "src" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (root / "src" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    manifest = root / "job.yaml"
    manifest.write_text("name: proj\nframework: custom\ncommand: python train.py\ncode: src\n")
    return manifest


def members(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(m.name for m in tar.getmembers())


def ship(logs, job_id, learner, seqs):
    logs.write([LogLine(job_id, "alpha", learner, 1, "stdout", s, f"2030-01-01T00:00:{s:02d}.{learner:03d}Z",
                        f"learner {learner} line {s}") for s in seqs], refresh=True)


def test_pack_code_leaves_out_caches_and_vcs(tmp_path):
    write_project(tmp_path)
    assert members(pack_code(tmp_path / "src")) == ["lib/util.py", "train.py"]
    with pytest.raises(ClientError):
        pack_code(tmp_path / "missing")


def test_submit_packs_the_code_folder_next_to_the_manifest(platform, tmp_path, monkeypatch):
    manifest = write_project(tmp_path / "project")
    monkeypatch.chdir(tmp_path)  # `code: src` is relative to the manifest, not to the cwd
    job = platform.client.submit(manifest)
    assert job["state"] == "queued" and job["name"] == "proj"
    stored = platform.objects.get_bytes(f"jobs/{job['id']}/code.tar.gz")
    assert members(stored) == ["lib/util.py", "train.py"]
    assert platform.client.get(job["id"])["id"] == job["id"]


def test_submit_a_dict_without_code_and_with_an_idempotency_key(platform):
    manifest = {"name": "tiny", "framework": "custom", "command": "true"}
    first = platform.client.submit(manifest, idempotency_key="once")
    again = platform.client.submit(manifest, idempotency_key="once")
    assert first["id"] == again["id"] and len(platform.trainer.submissions) == 1
    assert platform.trainer.submissions[0]["code_uri"] == ""


def test_errors_carry_status_code_and_fields(platform, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad_Name\nlearners: 0\n")
    with pytest.raises(ApiError) as e:
        platform.client.submit(bad)
    err = e.value
    assert (err.status, err.code) == (422, "invalid_argument")
    assert {d["field"] for d in err.details} == {"name", "learners", "command"}
    assert "name" in str(err) and "learners" in str(err) and "command" in str(err) and "\n" not in str(err)
    with pytest.raises(ApiError) as e:
        platform.client.get("j-000000000000")
    assert e.value.status == 404 and "not found" in str(e.value)
    with pytest.raises(ClientError, match="does not exist"):
        platform.client.submit({"name": "x", "command": "true"}, code_dir=tmp_path / "nope")
    with pytest.raises(ClientError, match="cannot read manifest"):
        platform.client.submit(tmp_path / "absent.yaml")


def test_wrong_key_and_unreachable_api(platform):
    with Client(platform.url, "tf_00000000_" + "x" * 43) as c, pytest.raises(ApiError) as e:
        c.list()
    assert e.value.status == 401
    with Client(f"http://127.0.0.1:{free_port()}", platform.key, timeout=2, retry_seconds=0) as c, \
            pytest.raises(ApiError) as e:
        c.list()
    assert e.value.status == 0 and "cannot reach" in str(e.value) and "trainforge up" in str(e.value)


def test_list_get_cancel(platform):
    a = platform.client.submit({"name": "a", "command": "true"})
    b = platform.client.submit({"name": "b", "command": "true"})
    assert [j["id"] for j in platform.client.list()] == [b["id"], a["id"]]
    assert platform.client.cancel(a["id"])["state"] == "cancelled"
    assert [j["id"] for j in platform.client.list(state="cancelled")] == [a["id"]]
    assert {j["id"] for j in platform.client.list(state=["cancelled", "queued"])} == {a["id"], b["id"]}


def test_list_filters_pages_and_iter_jobs(platform):
    client = platform.client
    made = [client.submit({"name": name, "command": "true"})["id"] for name in ("a", "b", "a")]
    for ts, job_id in zip((1000.0, 2000.0, 3000.0), made, strict=True):
        platform.trainer._jobs[job_id]["created_at"] = ts  # a fixed creation time each, for since/until
    newest_first = made[::-1]
    assert [j["id"] for j in client.list(name="a")] == [made[2], made[0]]
    assert [j["id"] for j in client.list(since=2000)] == [made[2], made[1]]
    assert [j["id"] for j in client.list(until="1970-01-01T00:33:20+00:00")] == [made[0]]
    assert [j["id"] for j in client.list(since=dt.datetime.fromtimestamp(2500, dt.UTC))] == [made[2]]
    first = client.list_page(limit=2)
    assert [j["id"] for j in first["jobs"]] == newest_first[:2] and first["next_cursor"]
    last = client.list_page(limit=2, cursor=first["next_cursor"])
    assert [j["id"] for j in last["jobs"]] == newest_first[2:] and last["next_cursor"] is None
    assert [j["id"] for j in client.iter_jobs(page_size=1)] == newest_first
    assert [j["id"] for j in client.iter_jobs(name="a", page_size=1)] == [made[2], made[0]]


def test_audit_pages_follow_the_cursor(platform, mongo_db):
    key = IdentityStore(mongo_db).issue_key("alpha", "admin", Role.PLATFORM_ADMIN)
    with Client(platform.url, key, timeout=10) as admin:
        for name in ("x", "y", "z"):
            admin.submit({"name": name, "command": "true"})
        everything = admin.admin.audit(limit=1000)
        assert len(everything) >= 3
        first = admin.admin.audit_page(limit=2)
        assert first["entries"] == everything[:2] and first["next_cursor"]
        second = admin.admin.audit_page(limit=2, cursor=first["next_cursor"])
        assert second["entries"] == everything[2:4]
        assert admin.admin.audit(until=0) == []


def test_logs_page_with_the_cursor(platform):
    job = platform.client.submit({"name": "logs", "command": "true"})
    ship(platform.logs, job["id"], 0, range(1, 6))
    lines, nxt = platform.client.logs(job["id"], limit=3)
    assert [ln["seq"] for ln in lines] == [1, 2, 3] and nxt == "0:1=3"
    lines, nxt = platform.client.logs(job["id"], after=nxt)
    assert [ln["seq"] for ln in lines] == [4, 5] and nxt == "0:1=5"
    assert platform.client.logs(job["id"], after=nxt) == ([], "0:1=5")


def test_follow_logs_streams_until_the_job_ended(platform):
    job = platform.client.submit({"name": "follow", "learners": 2, "command": "true"})
    ship(platform.logs, job["id"], 0, range(1, 4))
    states: list[str] = []
    got: list[tuple[int, int]] = []

    def finish():
        wait_for(lambda: len(got) >= 3, 10, "the first lines to be read")
        ship(platform.logs, job["id"], 1, range(1, 3))
        for state in TO_COMPLETED:
            platform.trainer.report(job["id"], state, f"now {state.name.lower()}")

    t = threading.Thread(target=finish)
    t.start()
    for line in platform.client.follow_logs(job["id"], poll_interval=0.05, on_state=states.append):
        got.append((line["learner"], line["seq"]))
    t.join(10)
    assert sorted(got) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]
    assert states[0] == "queued" and states[-1] == "completed"


def test_wait_reports_every_change_and_times_out(platform):
    job = platform.client.submit({"name": "wait", "command": "true"})
    seen: list[str] = []
    with pytest.raises(WaitTimeout, match="still queued"):
        platform.client.wait(job["id"], timeout=0.2, poll_interval=0.05)

    def advance():
        for state in TO_COMPLETED:
            wait_for(lambda: seen, 10, "the first poll")
            platform.trainer.report(job["id"], state, f"now {state.name.lower()}")

    t = threading.Thread(target=advance)
    t.start()
    final = platform.client.wait(job["id"], timeout=20, poll_interval=0.02, on_change=lambda j: seen.append(j["state"]))
    t.join(10)
    assert final["state"] == "completed"
    assert seen[0] == "queued" and seen[-1] == "completed"
    assert seen == sorted(set(seen), key=seen.index)  # each change once, in order


def test_wait_all_follows_many_jobs_by_what_changed_and_times_out(platform):
    client = platform.client
    jobs = [client.submit({"name": f"many{i}", "command": "true"}) for i in range(5)]
    ids = [j["id"] for j in jobs]
    with pytest.raises(WaitTimeout, match="5 of 5 jobs still queued"):
        client.wait_all(ids, timeout=0.2, poll_interval=0.05)
    everything, as_of = client.list_changed()
    assert {j["id"] for j in everything} == set(ids) and as_of > 0
    listed = []

    def advance():
        wait_for(lambda: listed, 10, "the first listing")
        for job_id in ids[:3]:
            for state in TO_COMPLETED:
                platform.trainer.report(job_id, state, f"now {state.name.lower()}")
        client.cancel(ids[3])
        for state in (JobState.DEPLOYING, JobState.RUNNING):
            platform.trainer.report(ids[4], state, f"now {state.name.lower()}")
        client.halt(ids[4])  # halted is where `wait` stops too

    t = threading.Thread(target=advance)
    t.start()
    final = client.wait_all([*ids, ids[0]], timeout=20, poll_interval=0.02, on_change=lambda j: listed.append(j["id"]))
    t.join(10)
    assert [j["id"] for j in final] == ids  # in the order asked, each once
    assert [j["state"] for j in final] == ["completed"] * 3 + ["cancelled", "halted"]
    # a follower that waits for ends reads only the jobs that ended since
    ended, _ = client.list_changed(as_of, state=["completed", "CANCELLED"])
    assert sorted(j["id"] for j in ended) == sorted(ids[:4])
    # only what changed: a listing since the end of it all is empty
    time.sleep(0.01)
    changed, _ = client.list_changed(time.time())
    assert changed == []
    assert [j.state for j in client.typed.wait_all(ids[:2], timeout=5)] == ["completed", "completed"]
    with pytest.raises(ApiError) as err:
        client.wait_all([ids[0], "j-000000000000"], timeout=5)
    assert err.value.status == 404


def test_a_429_is_waited_out_and_retried_then_reported(monkeypatch):
    import httpx

    from trainforge import sdk

    waits: list[float] = []
    monkeypatch.setattr(sdk.time, "sleep", waits.append)
    answers = iter([429, 429, 200])
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        status = next(answers, 429)
        if status == 429:
            return httpx.Response(429, headers={"Retry-After": "0"},
                                  json={"code": "resource_exhausted", "message": "too many requests", "details": []})
        return httpx.Response(200, json={"id": "j-1", "state": "running"})

    client = Client("http://api.invalid", "k", transport=httpx.MockTransport(handler))
    assert client.get("j-1")["state"] == "running"
    assert len(seen) == 3 and len(waits) == 2
    with pytest.raises(ApiError) as err:
        client.get("j-1")
    assert err.value.status == 429
    # every attempt is made, but there is no wait after the last one
    assert len(seen) == 3 + sdk.RATE_LIMIT_RETRIES and len(waits) == 2 + sdk.RATE_LIMIT_RETRIES - 1


@pytest.mark.parametrize(("retry_after", "waited"), [("3", 3.0), ("soon", 1.0), ("999", 10.0), ("0", 0.05), (None, 1.0)])
def test_a_429_waits_what_retry_after_asks_within_bounds(monkeypatch, retry_after, waited):
    import httpx

    from trainforge import sdk

    waits: list[float] = []
    monkeypatch.setattr(sdk.time, "sleep", waits.append)
    answers = iter([429, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        if next(answers) == 429:
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return httpx.Response(429, headers=headers, json={"code": "resource_exhausted", "message": "slow down",
                                                              "details": []})
        return httpx.Response(200, json={"id": "j-1", "state": "queued"})

    client = Client("http://api.invalid", "k", transport=httpx.MockTransport(handler))
    assert client.get("j-1")["state"] == "queued"
    assert waits == [waited]

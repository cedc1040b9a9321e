"""The shared adapters against real servers: etcd, the MongoDB-wire server, the log search server."""

from __future__ import annotations

import threading
import time

from tests.servers import wait_for
from trainforge_services.common.adapters.etcd import StopEvent
from trainforge_services.common.adapters.logstore import LogLine
from trainforge_services.common.adapters.objectstore import LocalStore, get_dir, put_dir


def test_etcd_create_is_exclusive_and_replace_compares_revision(coordinator):
    key = coordinator.keys.monitor("j1")
    assert coordinator.create(key, {"pid": 1}) is True
    assert coordinator.create(key, {"pid": 2}) is False
    value, rev = coordinator.get(key)
    assert value == {"pid": 1}
    assert coordinator.replace(key, rev, {"pid": 3}) is True
    assert coordinator.replace(key, rev, {"pid": 4}) is False
    assert coordinator.get(key)[0] == {"pid": 3}


def test_etcd_lease_expiry_deletes_key(coordinator):
    lease = coordinator.grant_lease(2)
    key = coordinator.keys.learner_status("j2", 0)
    coordinator.put(key, {"state": 2}, lease=lease)
    assert coordinator.get(key)[0] == {"state": 2}
    wait_for(lambda: coordinator.get(key)[0] is None, 10, "lease expiry to delete the key")


def test_etcd_watch_survives_restart(etcd_server, coordinator):
    prefix = coordinator.keys.learners("j3")
    stop = threading.Event()
    seen: list = []

    def watch():
        for ev in coordinator.watch_prefix(prefix, stop=stop):
            seen.append(ev)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    wait_for(lambda: seen and seen[0].kind == "resync", 10, "initial resync")
    coordinator.put(coordinator.keys.learner_status("j3", 0), {"state": 2})
    wait_for(lambda: any(e.kind == "put" for e in seen), 10, "first put event")
    etcd_server.restart()

    def put_again():
        coordinator.put(coordinator.keys.learner_status("j3", 1), {"state": 4})
        return True

    wait_for(put_again, 30, "etcd to accept writes after restart", interval=0.2)
    wait_for(lambda: any(e.kind == "put" and e.key.endswith("/1/status") for e in seen), 30,
             "event written after the restart")
    stop.set()
    t.join(5)


def test_a_stop_event_ends_a_quiet_watch_at_once(coordinator):
    """A watch with nothing to report notices a StopEvent without waiting out its poll (a job monitor's exit,
    which KillJob waits for, joins its watch)."""
    prefix = coordinator.keys.learners("j4")
    stop = StopEvent()
    seen: list = []
    done = threading.Event()

    def watch():
        for ev in coordinator.watch_prefix(prefix, stop=stop, poll=30.0):
            seen.append(ev)
        done.set()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    wait_for(lambda: seen and seen[0].kind == "resync", 10, "initial resync")
    coordinator.put(coordinator.keys.learner_status("j4", 0), {"state": 2})
    wait_for(lambda: any(e.kind == "put" for e in seen), 10, "the put event")
    started = time.monotonic()
    stop.set()
    assert done.wait(10), "the watch did not end"
    assert time.monotonic() - started < 5.0  # not the 30 s poll
    t.join(5)
    assert not t.is_alive()


def test_mongo_history_as_keyed_subdocuments(mongo_db):
    col = mongo_db.jobs
    col.insert_one({"_id": "j", "state": 1, "history": {}})
    col.update_one({"_id": "j"}, {"$set": {"history.000001": {"to": 2, "reason": "r"}}})
    col.update_one({"_id": "j"}, {"$set": {"history.000002": {"to": 3, "reason": "s"}}})
    doc = col.find_one({"_id": "j"})
    assert [doc["history"][k]["to"] for k in sorted(doc["history"])] == [2, 3]


def test_logstore_orders_and_resumes_from_cursor(logstore):
    def line(learner, seq, ts):
        return LogLine("job1", "team", learner, 1, "stdout", seq, ts, f"l{learner} s{seq}")

    logstore.write([line(0, 1, "2026-01-01T00:00:00.001Z"), line(1, 1, "2026-01-01T00:00:00.002Z"),
                    line(0, 2, "2026-01-01T00:00:00.003Z")], refresh=True)
    page = logstore.read("job1")
    assert [ln["line"] for ln in page.lines] == ["l0 s1", "l1 s1", "l0 s2"]
    # learner 1's second line arrives late with an earlier timestamp: still returned next time
    logstore.write([line(1, 2, "2026-01-01T00:00:00.0025Z"), line(0, 3, "2026-01-01T00:00:00.004Z")], refresh=True)
    page2 = logstore.read("job1", after=page.cursor)
    assert [ln["line"] for ln in page2.lines] == ["l1 s2", "l0 s3"]
    assert logstore.read("job1", learner=1).lines[-1]["line"] == "l1 s2"
    assert logstore.read("job1", team="other").lines == []


def test_local_store_round_trip_verified(tmp_path):
    store = LocalStore(tmp_path / "objects")
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.bin").write_bytes(b"x" * 1000)
    (src / "y.txt").write_text("y")
    infos = put_dir(store, "jobs/j/outputs/0", src)
    assert {i.key for i in infos} == {"jobs/j/outputs/0/a/x.bin", "jobs/j/outputs/0/y.txt"}
    got = get_dir(store, "jobs/j/outputs/0", tmp_path / "dst")
    assert sorted((i.size, i.sha256) for i in got) == sorted((i.size, i.sha256) for i in infos)
    assert (tmp_path / "dst" / "a" / "x.bin").read_bytes() == b"x" * 1000

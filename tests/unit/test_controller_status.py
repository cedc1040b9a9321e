"""The status publisher against an in-memory etcd twin that can be taken down and can expire leases."""

from __future__ import annotations

import threading
import time

from tests.servers import wait_for
from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.retry import QUICK
from trainforge_services.common.states import LearnerState
from trainforge_services.controller.status import StatusPublisher


class FakeLease:
    def __init__(self, etcd: FakeEtcd, lease_id: int):
        self.etcd, self.id = etcd, lease_id

    def refresh(self) -> bool:
        self.etcd.check()
        self.etcd.refreshes += 1
        return self.id not in self.etcd.expired

    def revoke(self) -> None:
        self.etcd.revoked.append(self.id)
        for key in [k for k, (_, lid) in self.etcd.data.items() if lid == self.id]:
            del self.etcd.data[key]


class FakeEtcd:
    """put/grant_lease like trainforge_services.common.adapters.etcd.Coordinator; `down` makes every call fail."""

    def __init__(self):
        self.data: dict[str, tuple[dict, int | None]] = {}
        self.down = threading.Event()
        self.expired: set[int] = set()
        self.revoked: list[int] = []
        self.leases = 0
        self.refreshes = 0
        self.calls_while_down = 0

    def check(self) -> None:
        if self.down.is_set():
            self.calls_while_down += 1
            raise Unavailable("etcd unavailable")

    def grant_lease(self, ttl: int) -> FakeLease:
        self.check()
        self.leases += 1
        return FakeLease(self, self.leases)

    def put(self, key: str, value: dict, lease: FakeLease | None = None) -> None:
        self.check()
        self.data[key] = (value, lease.id if lease else None)

    def state(self, key: str = "k") -> int | None:
        item = self.data.get(key)
        return item[0]["state"] if item else None


def doc(state: LearnerState, **kw) -> LearnerStatus:
    return LearnerStatus(state=state, attempt=1, **kw)


def test_the_stored_status_keeps_the_wire_format():
    d = LearnerStatus(state=LearnerState.LEARNER_FAILED, attempt=2, exit_code=3, message="m", tail=["a"]).value()
    assert set(d) == {"state", "attempt", "exit_code", "ts", "message", "tail", "outputs_uri", "step", "checkpoint_uri",
                      "isolation", "lines_archived", "lines_shipped", "timed_out"}
    assert (d["state"], d["attempt"], d["exit_code"], d["tail"]) == (int(LearnerState.LEARNER_FAILED), 2, 3, ["a"])
    assert type(d["state"]) is int
    assert abs(d["ts"] - time.time()) < 5
    assert LearnerStatus.parse(d) == LearnerStatus.parse(dict(d))


def test_the_publisher_stores_the_models_value():
    etcd = FakeEtcd()
    pub = StatusPublisher(etcd, "k", ttl=2).start()
    status = doc(LearnerState.LEARNER_RUNNING, message="go")
    pub.publish(status)
    wait_for(lambda: etcd.state() == LearnerState.LEARNER_RUNNING, 5, "RUNNING")
    assert etcd.data["k"][0] == status.value()
    assert pub.finish(doc(LearnerState.LEARNER_COMPLETED, exit_code=0), timeout=5)


def test_writes_under_a_lease_and_finishes_without_one():
    etcd = FakeEtcd()
    pub = StatusPublisher(etcd, "k", ttl=2).start()
    pub.publish(doc(LearnerState.LEARNER_PREPARING))
    wait_for(lambda: etcd.state() == LearnerState.LEARNER_PREPARING, 5, "PREPARING")
    assert etcd.data["k"][1] == 1, "written under the lease"
    pub.publish(doc(LearnerState.LEARNER_RUNNING))
    wait_for(lambda: etcd.state() == LearnerState.LEARNER_RUNNING, 5, "RUNNING")
    wait_for(lambda: etcd.refreshes >= 2, 5, "keep-alives every ttl/3")
    assert pub.finish(doc(LearnerState.LEARNER_COMPLETED, exit_code=0), timeout=5)
    assert etcd.data["k"][1] is None and etcd.state() == LearnerState.LEARNER_COMPLETED
    assert etcd.revoked == [1], "the lease is revoked after the lease-free final write"


def test_publish_never_blocks_while_etcd_is_down_and_the_latest_doc_wins():
    etcd = FakeEtcd()
    etcd.down.set()
    pub = StatusPublisher(etcd, "k", ttl=3, retry=QUICK.starting(0.0025)).start()
    started = time.monotonic()
    for state in (LearnerState.LEARNER_PREPARING, LearnerState.LEARNER_RUNNING):
        pub.publish(doc(state))
    assert time.monotonic() - started < 0.5
    wait_for(lambda: etcd.calls_while_down >= 3, 5, "retries while etcd is down")
    assert etcd.data == {}
    etcd.down.clear()
    wait_for(lambda: etcd.state() == LearnerState.LEARNER_RUNNING, 5, "the latest status after recovery")
    assert pub.finish(doc(LearnerState.LEARNER_FAILED), timeout=5)


def test_an_expired_lease_is_replaced_and_the_status_rewritten():
    etcd = FakeEtcd()
    pub = StatusPublisher(etcd, "k", ttl=2).start()
    pub.publish(doc(LearnerState.LEARNER_RUNNING))
    wait_for(lambda: etcd.state() == LearnerState.LEARNER_RUNNING, 5, "RUNNING")
    etcd.expired.add(1)
    del etcd.data["k"]  # what etcd does when a lease expires
    wait_for(lambda: etcd.leases == 2 and etcd.data.get("k", ({}, None))[1] == 2, 5,
             "a new lease holding the status again")
    assert etcd.state() == LearnerState.LEARNER_RUNNING
    assert pub.finish(doc(LearnerState.LEARNER_COMPLETED), timeout=5)


def test_finish_gives_up_at_its_deadline():
    etcd = FakeEtcd()
    etcd.down.set()
    pub = StatusPublisher(etcd, "k", ttl=3, retry=QUICK.starting(0.0025)).start()
    started = time.monotonic()
    assert pub.finish(doc(LearnerState.LEARNER_FAILED), timeout=0.3) is False
    assert time.monotonic() - started < 3

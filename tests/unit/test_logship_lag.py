"""Log-shipping lag: the controller's reports in etcd and the LCM's gauge summing them per running job."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainforge_services.common.errors import Unavailable
from trainforge_services.common.keys import Keys
from trainforge_services.controller.lagreport import LagReporter
from trainforge_services.lcm.lifecycle.types import RunningJob
from trainforge_services.lcm.wiring import lcm_registry


class FakeCoordinator:
    def __init__(self) -> None:
        self.keys = Keys()
        self.values: dict[str, dict] = {}
        self.fail = False

    def put(self, key: str, value: dict, lease: object = None) -> None:
        if self.fail:
            raise Unavailable("etcd is down")
        self.values[key] = {**value, "lease": lease}

    def list(self, prefix: str) -> tuple[dict[str, dict], int]:
        return {k: v for k, v in self.values.items() if k.startswith(prefix)}, 1


def test_the_controller_reports_changed_counts_under_its_lease_only():
    coord, counts, lease = FakeCoordinator(), [10, 4], [None]
    key = coord.keys.logship("j-0123456789ab", 0)
    reporter = LagReporter(coord, key, 2, lambda: lease[0], lambda: tuple(counts))
    assert not reporter.report() and key not in coord.values  # no lease yet: nothing that would outlive us
    lease[0] = "lease-1"
    assert reporter.report()
    assert coord.values[key] == {"attempt": 2, "archived": 10, "shipped": 4, "lease": "lease-1"}
    assert not reporter.report()  # unchanged
    counts[1] = 10
    coord.fail = True
    assert not reporter.report()  # logged, tried again next time
    coord.fail = False
    assert reporter.report() and coord.values[key]["shipped"] == 10


class FakeLifecycle:
    def __init__(self, coordinator: FakeCoordinator, jobs: list[RunningJob]):
        self.coordinator, self._jobs = coordinator, jobs

    def running_jobs(self) -> list[RunningJob]:
        return self._jobs


def test_the_lcm_exports_the_lag_of_each_running_job_current_attempt():
    coord = FakeCoordinator()
    coord.put(coord.keys.logship("j-aaaaaaaaaaaa", 0), {"attempt": 1, "archived": 100, "shipped": 40})
    coord.put(coord.keys.logship("j-aaaaaaaaaaaa", 1), {"attempt": 1, "archived": 50, "shipped": 50})
    coord.put(coord.keys.logship("j-bbbbbbbbbbbb", 0), {"attempt": 1, "archived": 9, "shipped": 1})  # old attempt
    jobs = [RunningJob("j-aaaaaaaaaaaa", 1, 2), RunningJob("j-bbbbbbbbbbbb", 2, 1)]
    text = generate_latest(lcm_registry(FakeLifecycle(coord, jobs))).decode()
    found = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert [(s.labels, s.value) for s in found["trainforge_log_shipping_lag_lines"]] == [
        ({"job": "j-aaaaaaaaaaaa"}, 60.0)]

"""The job monitor against real etcd: learner docs written here, reports caught by a fake reporter.

`test_monitor_process.py` runs the monitor as a process against a fake Trainer.
"""

from __future__ import annotations

import os
import threading

import pytest

from tests.integration.conftest import monitor_claimed, put
from tests.servers import wait_for
from trainforge_protos import trainer_pb2
from trainforge_services.common.contracts.etcd import MonitorClaim
from trainforge_services.common.contracts.specs import MonitorSpec
from trainforge_services.common.errors import NotFound, Unavailable
from trainforge_services.common.states import JobState, LearnerState
from trainforge_services.jobmonitor.monitor import JobMonitor

L = LearnerState


class FakeReporter:
    """Records delivered reports; raises Unavailable while `failing` is set."""

    def __init__(self):
        self.reports: list[trainer_pb2.ReportJobStatusRequest] = []
        self.attempts = 0
        self.failing = threading.Event()
        self.refuse: set[int] = set()

    def report(self, request: trainer_pb2.ReportJobStatusRequest) -> None:
        self.attempts += 1
        if self.failing.is_set():
            raise Unavailable("service unavailable: connection refused")
        if request.state in self.refuse:
            raise NotFound(f"job {request.job_id!r} not found")
        self.reports.append(request)

    @property
    def states(self) -> list[JobState]:
        return [JobState(r.state) for r in self.reports]


class Running:
    """A monitor run in a thread of the test."""

    def __init__(self, monitor: JobMonitor):
        self.monitor = monitor
        self.rc: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.rc = self.monitor.run()

    def wait(self, timeout: float = 20) -> int | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the monitor did not exit"
        return self.rc

    def stop(self) -> None:
        self.monitor.stop()
        self.wait()


@pytest.fixture
def start(coordinator, job):
    started: list[Running] = []

    def _start(reporter, learners: int = 2, attempt: int = 1, start_timeout: float = 60, **kw) -> Running:
        spec = MonitorSpec(job_id=job, team="team-a", attempt=attempt, learners=learners,
                           start_timeout=start_timeout)
        kw.setdefault("retry_seconds", 0.05)
        run = Running(JobMonitor(spec, coordinator, reporter, **kw))
        started.append(run)
        return run

    yield _start
    for run in started:
        run.monitor.stop()
        run.thread.join(10)


def test_two_learners_run_then_complete_with_skipped_states_walked_in_order(coordinator, job, start):
    reporter = FakeReporter()
    run = start(reporter)
    wait_for(lambda: monitor_claimed(coordinator, job), 10, "the monitor to claim the job")
    put(coordinator, job, 0, L.LEARNER_PREPARING)
    put(coordinator, job, 1, L.LEARNER_RUNNING)
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    wait_for(lambda: reporter.states == [JobState.RUNNING], 10, "RUNNING")
    assert reporter.reports[0].reason == "all 2 learners started"
    assert reporter.reports[0].outputs_uri == ""
    assert [(s.rank, s.state, s.attempt) for s in reporter.reports[0].learners] == [
        (0, L.LEARNER_RUNNING, 1), (1, L.LEARNER_RUNNING, 1)]

    put(coordinator, job, 0, L.LEARNER_COMPLETED, exit_code=0)
    put(coordinator, job, 1, L.LEARNER_COMPLETED, exit_code=0)
    assert run.wait() == 0
    assert reporter.states == [JobState.RUNNING, JobState.STORING, JobState.COMPLETED]
    final = reporter.reports[-1]
    assert (final.job_id, final.attempt, final.actor) == (job, 1, "monitor")
    assert final.outputs_uri == f"store://jobs/{job}/outputs/"
    assert reporter.reports[1].outputs_uri == final.outputs_uri
    assert [s.state for s in final.learners] == [L.LEARNER_COMPLETED, L.LEARNER_COMPLETED]
    assert run.monitor.delivered == reporter.states
    assert not monitor_claimed(coordinator, job), "the monitor's key outlived it"


def test_a_halt_is_reported_once_every_learner_halted_and_the_monitor_exits(coordinator, job, start):
    reporter = FakeReporter()
    run = start(reporter)
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    put(coordinator, job, 1, L.LEARNER_RUNNING)
    wait_for(lambda: reporter.states == [JobState.RUNNING], 10, "RUNNING")
    put(coordinator, job, 0, L.LEARNER_HALTING)
    put(coordinator, job, 1, L.LEARNER_HALTED, exit_code=0, step=41)
    put(coordinator, job, 0, L.LEARNER_HALTED, exit_code=0, step=40)
    assert run.wait() == 0
    assert reporter.states == [JobState.RUNNING, JobState.HALTED]
    halted = reporter.reports[-1]
    assert (halted.reason, halted.checkpoint_step) == ("all 2 learners halted at step 40", 40)
    assert [s.state for s in halted.learners] == [L.LEARNER_HALTED, L.LEARNER_HALTED]
    assert not monitor_claimed(coordinator, job)


def test_deploying_straight_to_completed_reports_every_step(coordinator, job, start):
    put(coordinator, job, 0, L.LEARNER_COMPLETED, exit_code=0)
    put(coordinator, job, 1, L.LEARNER_COMPLETED, exit_code=0)
    reporter = FakeReporter()
    assert start(reporter).wait() == 0
    assert reporter.states == [JobState.RUNNING, JobState.STORING, JobState.COMPLETED]
    assert [r.reason for r in reporter.reports] == [
        "every learner started", "every learner exited 0; storing outputs",
        "all 2 learners completed; outputs stored"]


def test_preparing_messages_are_reported_as_the_deploying_reason_on_change_and_throttled(coordinator, job,
                                                                                        start):
    reporter = FakeReporter()
    start(reporter, progress_interval=0.2)
    wait_for(lambda: monitor_claimed(coordinator, job), 10, "the monitor to claim the job")
    put(coordinator, job, 0, L.LEARNER_PREPARING)
    put(coordinator, job, 1, L.LEARNER_PREPARING, message="building the environment: Resolved 12 packages")
    wait_for(lambda: reporter.reports, 10, "the preparing progress")
    first = reporter.reports[0]
    assert (JobState(first.state), first.reason) == (
        JobState.DEPLOYING, "preparing: learner 1: building the environment: Resolved 12 packages")
    assert [s.state for s in first.learners] == [L.LEARNER_PREPARING, L.LEARNER_PREPARING]
    put(coordinator, job, 0, L.LEARNER_PREPARING, message="restoring the checkpoint")
    wait_for(lambda: len(reporter.reports) == 2, 10, "the changed progress")
    assert reporter.reports[1].reason == ("preparing: learner 0: restoring the checkpoint; "
                                          "learner 1: building the environment: Resolved 12 packages")
    # the same messages again (a status rewritten with a new timestamp) are not reported again
    put(coordinator, job, 0, L.LEARNER_PREPARING, message="restoring the checkpoint")
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    put(coordinator, job, 1, L.LEARNER_RUNNING)
    wait_for(lambda: JobState.RUNNING in reporter.states, 10, "RUNNING")
    assert reporter.states == [JobState.DEPLOYING, JobState.DEPLOYING, JobState.RUNNING]
    assert reporter.reports[-1].reason == "all 2 learners started"


def test_many_preparing_messages_in_a_burst_make_few_reports(coordinator, job, start):
    reporter = FakeReporter()
    run = start(reporter, learners=1, progress_interval=60)
    put(coordinator, job, 0, L.LEARNER_PREPARING, message="installing 1/40")
    wait_for(lambda: reporter.reports, 10, "the first progress")
    for i in range(2, 41):
        put(coordinator, job, 0, L.LEARNER_PREPARING, message=f"installing {i}/40")
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    wait_for(lambda: JobState.RUNNING in reporter.states, 10, "RUNNING")
    assert [r.reason for r in reporter.reports] == ["preparing: learner 0: installing 1/40", "all 1 learners started"]
    assert run.monitor.delivered == [JobState.RUNNING]


def test_a_learner_exiting_3_fails_the_job_with_code_and_tail(coordinator, job, start):
    reporter = FakeReporter()
    run = start(reporter)
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    put(coordinator, job, 1, L.LEARNER_RUNNING)
    wait_for(lambda: reporter.states == [JobState.RUNNING], 10, "RUNNING")
    put(coordinator, job, 1, L.LEARNER_FAILED, exit_code=3, tail=["loading data", "RuntimeError: out of cheese"])
    assert run.wait() == 0
    assert reporter.states == [JobState.RUNNING, JobState.FAILED]
    failed = reporter.reports[-1]
    assert failed.reason == "learner 1 exited with code 3; last lines:\nloading data\nRuntimeError: out of cheese"
    assert failed.outputs_uri == ""
    assert [(s.rank, s.state, s.exit_code) for s in failed.learners] == [
        (0, L.LEARNER_RUNNING, 0), (1, L.LEARNER_FAILED, 3)]


def test_a_learner_whose_lease_expires_is_lost(coordinator, job, start):
    reporter = FakeReporter()
    run = start(reporter)
    lease = coordinator.grant_lease(2)
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    put(coordinator, job, 1, L.LEARNER_RUNNING, lease=lease)
    wait_for(lambda: reporter.states == [JobState.RUNNING], 10, "RUNNING")
    # nobody refreshes the lease: the controller "died"
    assert run.wait(30) == 0
    assert reporter.states == [JobState.RUNNING, JobState.FAILED]
    assert reporter.reports[-1].reason == "learner 1 lost: its controller stopped renewing its lease"
    lost = reporter.reports[-1].learners[1]
    assert lost.state == L.LEARNER_RUNNING and "lost" in lost.message


def test_a_final_status_written_within_a_lease_ttl_of_the_expiry_is_not_a_loss(coordinator, job, start):
    """A controller cut off from etcd (an etcd restart) sees its lease expire, then writes its final status."""
    reporter = FakeReporter()
    run = start(reporter, lease_ttl=5)
    lease = coordinator.grant_lease(2)
    put(coordinator, job, 0, L.LEARNER_COMPLETED, exit_code=0)
    put(coordinator, job, 1, L.LEARNER_RUNNING, lease=lease)
    wait_for(lambda: reporter.states == [JobState.RUNNING], 10, "RUNNING")
    wait_for(lambda: coordinator.get(coordinator.keys.learner_status(job, 1))[0] is None, 15, "the lease to expire")
    put(coordinator, job, 1, L.LEARNER_COMPLETED, exit_code=0)
    assert run.wait(30) == 0
    assert reporter.states == [JobState.RUNNING, JobState.STORING, JobState.COMPLETED]


def test_a_learner_that_finished_and_let_its_lease_go_is_not_lost(coordinator, job, start):
    reporter = FakeReporter()
    run = start(reporter)
    lease = coordinator.grant_lease(10)
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    put(coordinator, job, 1, L.LEARNER_COMPLETED, exit_code=0, lease=lease)
    wait_for(lambda: reporter.states == [JobState.RUNNING], 10, "RUNNING")
    lease.revoke()
    wait_for(lambda: coordinator.get(coordinator.keys.learner_status(job, 1))[0] is None, 10, "key removed")
    put(coordinator, job, 0, L.LEARNER_COMPLETED, exit_code=0)
    assert run.wait() == 0
    assert reporter.states == [JobState.RUNNING, JobState.STORING, JobState.COMPLETED]


def test_a_learner_that_never_writes_times_out(coordinator, job, start):
    reporter = FakeReporter()
    run = start(reporter, start_timeout=1)
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    assert run.wait() == 0
    assert reporter.states == [JobState.FAILED]
    assert reporter.reports[0].reason == "learner 1 never started within 1s"


def test_docs_of_an_earlier_attempt_are_ignored(coordinator, job, start):
    put(coordinator, job, 0, L.LEARNER_FAILED, attempt=1, exit_code=1)
    put(coordinator, job, 1, L.LEARNER_COMPLETED, attempt=1)
    reporter = FakeReporter()
    run = start(reporter, attempt=2)
    wait_for(lambda: monitor_claimed(coordinator, job), 10, "the claim")
    put(coordinator, job, 0, L.LEARNER_RUNNING, attempt=2)
    put(coordinator, job, 1, L.LEARNER_RUNNING, attempt=2)
    wait_for(lambda: reporter.states == [JobState.RUNNING], 10, "RUNNING")
    assert all(r.attempt == 2 for r in reporter.reports)
    run.stop()
    assert reporter.states == [JobState.RUNNING]


def test_a_second_monitor_for_the_job_exits_without_reporting(coordinator, job, start):
    first, second = FakeReporter(), FakeReporter()
    run = start(first)
    wait_for(lambda: monitor_claimed(coordinator, job), 10, "the first monitor's claim")
    assert start(second).wait() == 0
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    put(coordinator, job, 1, L.LEARNER_RUNNING)
    wait_for(lambda: first.states == [JobState.RUNNING], 10, "the first monitor's report")
    assert second.attempts == 0
    run.stop()
    assert not monitor_claimed(coordinator, job)


@pytest.mark.parametrize("claim", [MonitorClaim(pid=1, host="elsewhere", attempt=1).value(),
                                   {"pid": 1, "attempt": 1}], ids=["earlier-attempt", "unreadable"])
def test_a_monitor_of_a_later_attempt_waits_out_a_dead_earlier_monitor(coordinator, job, start, claim, caplog):
    lease = coordinator.grant_lease(2)  # an attempt-1 monitor that was SIGKILLed: nobody refreshes it
    assert coordinator.create(coordinator.keys.monitor(job), claim, lease=lease)
    reporter = FakeReporter()
    run = start(reporter, attempt=2)
    put(coordinator, job, 0, L.LEARNER_COMPLETED, attempt=2)
    put(coordinator, job, 1, L.LEARNER_COMPLETED, attempt=2)
    assert run.wait(30) == 0
    assert reporter.states == [JobState.RUNNING, JobState.STORING, JobState.COMPLETED]
    unreadable = [r.getMessage() for r in caplog.records if "unreadable claim" in r.getMessage()]
    assert bool(unreadable) == ("host" not in claim)
    assert all(coordinator.keys.monitor(job) in m for m in unreadable)


def test_the_claim_is_a_monitor_claim_value(coordinator, job, start):
    run = start(FakeReporter(), attempt=3)
    value = wait_for(lambda: coordinator.get(coordinator.keys.monitor(job))[0], 10, "the claim")
    claim = MonitorClaim.parse(value)
    assert (claim.pid, claim.attempt) == (os.getpid(), 3)
    run.stop()


def test_a_malformed_status_is_logged_with_its_key_and_skipped(coordinator, job, start, caplog):
    reporter = FakeReporter()
    run = start(reporter)
    wait_for(lambda: monitor_claimed(coordinator, job), 10, "the claim")
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    put(coordinator, job, 1, L.LEARNER_RUNNING)
    wait_for(lambda: reporter.states == [JobState.RUNNING], 10, "RUNNING")
    key = coordinator.keys.learner_status(job, 1)
    coordinator.put(key, {"state": "bogus", "attempt": 1})
    wait_for(lambda: any(key in r.getMessage() and "skipping" in r.getMessage() for r in caplog.records), 10,
             "the malformed value logged with its key")
    put(coordinator, job, 0, L.LEARNER_COMPLETED, exit_code=0)
    put(coordinator, job, 1, L.LEARNER_COMPLETED, exit_code=0)
    assert run.wait() == 0
    assert reporter.states == [JobState.RUNNING, JobState.STORING, JobState.COMPLETED]


def test_the_monitor_keeps_its_claim_alive_beyond_the_lease_ttl(coordinator, job, start, unique):
    reporter = FakeReporter()
    run = start(reporter, lease_ttl=2)
    claim = wait_for(lambda: coordinator.get(coordinator.keys.monitor(job))[0], 10, "the claim")
    timer = coordinator.grant_lease(5)  # outlives two of the monitor's TTLs
    coordinator.put(f"{coordinator.keys.prefix}/timer-{unique}", {}, lease=timer)
    wait_for(lambda: coordinator.get(f"{coordinator.keys.prefix}/timer-{unique}")[0] is None, 20, "5 seconds")
    assert coordinator.get(coordinator.keys.monitor(job))[0] == claim
    assert start(FakeReporter()).wait() == 0, "a second monitor got the job while the first ran"
    run.stop()


def test_reports_are_retried_while_the_reporter_fails_and_none_is_dropped(coordinator, job, start):
    reporter = FakeReporter()
    reporter.failing.set()
    run = start(reporter)
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    put(coordinator, job, 1, L.LEARNER_RUNNING)
    wait_for(lambda: reporter.attempts >= 3, 10, "several failed tries")
    put(coordinator, job, 0, L.LEARNER_STORING, exit_code=0)
    put(coordinator, job, 1, L.LEARNER_COMPLETED, exit_code=0)
    put(coordinator, job, 0, L.LEARNER_COMPLETED, exit_code=0)
    tries = reporter.attempts
    wait_for(lambda: reporter.attempts >= tries + 3, 10, "more failed tries")
    assert reporter.reports == []
    reporter.failing.clear()
    assert run.wait() == 0
    assert reporter.states == [JobState.RUNNING, JobState.STORING, JobState.COMPLETED]


def test_a_report_the_trainer_refuses_for_good_is_not_retried(coordinator, job, start):
    reporter = FakeReporter()
    reporter.refuse.add(JobState.RUNNING)
    run = start(reporter)
    put(coordinator, job, 0, L.LEARNER_COMPLETED, exit_code=0)
    put(coordinator, job, 1, L.LEARNER_COMPLETED, exit_code=0)
    assert run.wait() == 0
    assert reporter.states == [JobState.STORING, JobState.COMPLETED]
    assert reporter.attempts == 3


@pytest.mark.slow
def test_the_monitor_keeps_working_across_an_etcd_restart(etcd_server, coordinator, job, start):
    reporter = FakeReporter()
    run = start(reporter)
    put(coordinator, job, 0, L.LEARNER_RUNNING)
    put(coordinator, job, 1, L.LEARNER_RUNNING)
    wait_for(lambda: reporter.states == [JobState.RUNNING], 10, "RUNNING")
    etcd_server.restart()

    def complete() -> bool:
        put(coordinator, job, 0, L.LEARNER_COMPLETED, exit_code=0)
        put(coordinator, job, 1, L.LEARNER_COMPLETED, exit_code=0)
        return True

    wait_for(complete, 30, "etcd to accept writes after the restart", interval=0.2)
    assert run.wait(30) == 0
    assert reporter.states == [JobState.RUNNING, JobState.STORING, JobState.COMPLETED]
    assert not monitor_claimed(coordinator, job)


# -- the monitor as a process ---------------------------------------------------

"""The job monitor: one process per job attempt, turning learner statuses into job states.

It exists so that the Trainer never has to watch etcd: the monitor claims the
job (a lease-held `monitor` key, so a second monitor for the same job steps
aside), follows `learners/` with a watch that survives etcd restarts and
compaction, asks `aggregate` what the job's state is after every change, and
reports each state the job moves through to the Trainer, in order (HALTED,
off the main line, once every learner has checkpointed and exited). A report
the Trainer cannot take yet is retried, never dropped, and nothing later
overtakes it. The monitor exits once a terminal state has been delivered.

While the job is DEPLOYING, what the learners' PREPARING statuses say
(an environment build's installer line, a checkpoint restore) is reported
as a DEPLOYING -> DEPLOYING reason update, so `trainforge status` shows
why a job takes its time. Those reports are best-effort progress: sent only
on change, at most one per `progress_interval`, never ahead of a state.

The Trainer is reached through the `Reporter` interface so tests can count
what would have been sent. Every etcd value is read and written through the
models in services/common/contracts/etcd.py; a value that does not parse is
logged with its key and skipped, never allowed to stop the watch.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

from trainforge_protos import common_pb2, trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import rpc, states
from trainforge_services.common.adapters.etcd import Coordinator, Event, StopEvent
from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.contracts.specs import MonitorSpec
from trainforge_services.common.contracts.storekeys import outputs_root, uri_for_prefix
from trainforge_services.common.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    message_of,
)
from trainforge_services.common.retry import REPORT
from trainforge_services.common.states import JobState, LearnerState
from trainforge_services.jobmonitor.aggregate import (
    Verdict,
    aggregate,
    learner_views,
    of_attempt,
    preparing_reason,
)
from trainforge_services.jobmonitor.claim import JobClaim
from trainforge_services.jobmonitor.elastic import aggregate_elastic

log = logging.getLogger(__name__)

ACTOR = "monitor"
LEASE_TTL = 10
# At most one preparing-progress report per this many seconds: an installer prints faster than anyone reads.
PROGRESS_INTERVAL = 1.0
# Errors that say the Trainer will never take this report: retrying cannot help.
_PERMANENT = (InvalidArgument, NotFound, Conflict, PermissionDenied, Unauthenticated)
# Why the job entered a state the monitor walked through on its way to a later one.
_STEP_REASONS = {
    JobState.RUNNING: "every learner started",
    JobState.STORING: "every learner exited 0; storing outputs",
}
_LOST = "lost: its controller stopped renewing its lease"


class Reporter(Protocol):
    def report(self, request: trainer_pb2.ReportJobStatusRequest) -> None:
        """Deliver one report. Raise Unavailable when the Trainer cannot take it now (it is retried)."""


class GrpcReporter:
    """Reports to the Trainer's ReportJobStatus."""

    def __init__(self, address: str, timeout: float = 10.0, *, authorization: str = ""):
        """`authorization`: the job's own credential for its reports (common/rpcauth.py `job_authorization`)."""
        self._channel = rpc.channel(address, authorization=authorization)
        self._stub = trainer_pb2_grpc.TrainerStub(self._channel)
        self._timeout = timeout

    def report(self, request: trainer_pb2.ReportJobStatusRequest) -> None:
        rpc.call(self._stub.ReportJobStatus, request, self._timeout)

    def close(self) -> None:
        self._channel.close()


class JobMonitor:
    """Watches one attempt of one job until it is terminal; `run()` returns the exit status."""

    def __init__(self, spec: MonitorSpec, coordinator: Coordinator, reporter: Reporter, *,
                 retry_seconds: float = 1.0, lease_ttl: int = LEASE_TTL,
                 progress_interval: float = PROGRESS_INTERVAL, clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self._coord = coordinator
        self._reporter = reporter
        self._retry = REPORT.starting(retry_seconds)
        self._report_backoff = self._retry.backoff()
        self._clock = clock
        self._keys = coordinator.keys
        # a stop wakes the watch thread at once (it is joined on the way out, and KillJob waits for this exit)
        self._stop = StopEvent()
        self._events: queue.Queue[Event] = queue.Queue()
        self._claim = JobClaim(coordinator, spec.job_id, spec.attempt, lease_ttl=lease_ttl, retry=self._retry,
                               stop=self._stop, clock=clock)
        # what the monitor knows of the learners
        self._current: dict[int, LearnerStatus] = {}
        self._last_seen: dict[int, LearnerStatus] = {}
        # ranks whose leased status vanished, and when: such a learner counts as lost only after a
        # further lease TTL without a new status. A controller cut off from etcd (an etcd restart) may
        # see its lease expire while it is still writing its final status, which arrives moments later.
        self._vanished: dict[int, float] = {}
        self._lost_grace = float(lease_ttl)
        self._synced = False
        # what it has decided and sent
        self._reached = JobState.DEPLOYING  # the last state queued for reporting
        self._outbox: list[trainer_pb2.ReportJobStatusRequest] = []
        self._next_try = 0.0
        self._delivered: list[JobState] = []
        # the latest preparing progress not yet delivered, and what and when was last queued
        self._progress: trainer_pb2.ReportJobStatusRequest | None = None
        self._progress_reason = ""
        self._progress_at = -math.inf
        self._progress_interval = progress_interval
        # an elastic job's learners and their states as last reported (services/jobmonitor/elastic.py)
        self._members: tuple[tuple[int, int], ...] = ()

    # -- lifecycle ---------------------------------------------------------------

    def stop(self) -> None:
        """Ask `run()` to return soon without reporting anything more."""
        self._stop.set()

    def run(self) -> int:
        job = self.spec.job_id
        if not self._claim.acquire():
            return 0
        log.info("job %s attempt %d: monitoring %d learner(s)", job, self.spec.attempt, self.spec.learners)
        self._claim.keep()
        # not a Loop: a blocking watch of the learners' keys, reopened when it fails
        watch = threading.Thread(target=self._watch, name="monitor-watch", daemon=True)
        watch.start()
        started = self._clock()
        try:
            while not self._stop.is_set():
                if self._claim.lost.is_set():
                    log.warning("job %s: another monitor took over; exiting", job)
                    return 0
                self._take_events(timeout=self._wait_time())
                if self._synced:
                    self._decide(self._clock() - started)
                    self._note_progress()
                self._deliver()
                if self._finished():
                    log.info("job %s attempt %d: %s reported; exiting", job, self.spec.attempt,
                             self._reached.name)
                    return 0
            return 0
        finally:
            self._stop.set()
            watch.join(5)
            self._claim.release()

    @property
    def finished(self) -> bool:
        """The attempt's last state (terminal, or HALTED) has been delivered: nothing is left to watch."""
        return self._finished()

    @property
    def delivered(self) -> list[JobState]:
        """States the Trainer has taken, in order (for diagnostics and tests)."""
        return list(self._delivered)

    # -- watching the learners ---------------------------------------------------

    def _watch(self) -> None:
        prefix = self._keys.learners(self.spec.job_id)
        backoff = self._retry.backoff()
        while not self._stop.is_set():
            try:
                for event in self._coord.watch_prefix(prefix, stop=self._stop):
                    self._events.put(event)
                    backoff.reset()
            except Exception:  # noqa: BLE001 - a broken watch must not blind the monitor: reopen it
                log.exception("job %s: watch failed; reopening", self.spec.job_id)
                self._stop.wait(backoff.next())

    def _take_events(self, timeout: float) -> None:
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._apply(event)
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return

    def _apply(self, event: Event) -> None:
        if event.kind == "resync":
            before = set(self._current)
            self._current = {}
            for key, value in (event.snapshot or {}).items():
                self._apply_put(key, value)
            for rank in before - set(self._current):
                self._vanished.setdefault(rank, self._clock())
            self._synced = True
            return
        if event.kind == "put":
            self._apply_put(event.key, event.value or {})
        elif event.kind == "delete":
            parsed = self._keys.parse_learner_key(self.spec.job_id, event.key)
            if parsed and parsed[1] == "status" and self._current.pop(parsed[0], None) is not None:
                self._vanished.setdefault(parsed[0], self._clock())

    def _apply_put(self, key: str, value: dict) -> None:
        parsed = self._keys.parse_learner_key(self.spec.job_id, key)
        if not parsed or parsed[1] != "status":
            return
        rank = parsed[0]
        try:
            status = LearnerStatus.parse(value)
        except InvalidArgument as e:
            log.warning("job %s: skipping the value at %s: %s", self.spec.job_id, key, e.message)
            return
        self._current[rank] = status
        self._vanished.pop(rank, None)
        if of_attempt(status, self.spec.attempt):
            self._last_seen[rank] = status

    # -- deciding and reporting --------------------------------------------------

    def _wait_time(self) -> float:
        if self._outbox:
            return max(0.0, min(0.5, self._next_try - self._clock()))
        return 0.5 if self._synced else 0.1

    def verdict(self, waited: float) -> Verdict:
        current = self._current
        now = self._clock()
        recent = {rank: self._last_seen[rank] for rank, at in self._vanished.items()
                  if now - at < self._lost_grace and rank in self._last_seen and rank not in current}
        if recent:  # not lost yet: as they last were, until the grace is over or a new status comes
            current = {**current, **recent}
        if self.spec.elastic:
            return aggregate_elastic(current, slots=self.spec.slots, initial=self.spec.learners,
                                     minimum=self.spec.min_learners, attempt=self.spec.attempt,
                                     last_seen=self._last_seen, waited=waited, start_timeout=self.spec.start_timeout)
        return aggregate(current, self.spec.learners, self.spec.attempt, self._last_seen,
                         waited=waited, start_timeout=self.spec.start_timeout)

    def _decide(self, waited: float) -> None:
        if _final(self._reached):
            return
        verdict = self.verdict(waited)
        if verdict.state == JobState.HALTED:
            # off the main line: the Trainer moved the job to HALTING when the halt was asked for
            request = trainer_pb2.ReportJobStatusRequest(
                job_id=self.spec.job_id, attempt=self.spec.attempt, state=JobState.HALTED, reason=verdict.reason,
                actor=ACTOR, learners=self._learner_statuses())
            if verdict.checkpoint_step is not None:
                request.checkpoint_step = verdict.checkpoint_step
            self._outbox.append(request)
            log.info("job %s attempt %d: %s", self.spec.job_id, self.spec.attempt, verdict.reason)
            self._reached = JobState.HALTED
            return
        steps = states.path_along_main_line(self._reached, verdict.state)
        if not steps:
            self._note_membership(verdict)
            return
        learners = self._learner_statuses()
        self._members = _membership(learners)
        for step in steps:
            reason = verdict.reason if step == verdict.state else _STEP_REASONS.get(step, verdict.reason)
            stored = step in (JobState.STORING, JobState.COMPLETED)
            uri = uri_for_prefix(outputs_root(self.spec.job_id)) if stored else ""
            self._outbox.append(trainer_pb2.ReportJobStatusRequest(
                job_id=self.spec.job_id, attempt=self.spec.attempt, state=step, reason=reason, actor=ACTOR,
                learners=learners, outputs_uri=uri))
            log.info("job %s attempt %d: %s -> %s: %s", self.spec.job_id, self.spec.attempt,
                     self._reached.name, step.name, reason.splitlines()[0] if reason else "")
            self._reached = step

    def _note_membership(self, verdict: Verdict) -> None:
        """An elastic job that runs on while learners leave or join: the Trainer hears each change (the
        same state with the learners now), so the job's current and target size stay true."""
        if not self.spec.elastic or self._reached != JobState.RUNNING or verdict.state != JobState.RUNNING:
            return
        learners = self._learner_statuses()
        members = _membership(learners)
        if members == self._members:
            return
        self._members = members
        self._outbox.append(trainer_pb2.ReportJobStatusRequest(
            job_id=self.spec.job_id, attempt=self.spec.attempt, state=JobState.RUNNING, reason=verdict.reason,
            actor=ACTOR, learners=learners))
        log.info("job %s attempt %d: %s", self.spec.job_id, self.spec.attempt, verdict.reason)

    def _note_progress(self) -> None:
        """While the job deploys, queue the learners' preparing messages as its reason (on change, throttled)."""
        if self._reached != JobState.DEPLOYING or self._outbox:
            self._progress = None  # a state is on its way: progress of DEPLOYING would only be stale
            return
        views = learner_views(self._current, self._last_seen, self.spec.slots, self.spec.attempt)
        reason = preparing_reason(views)
        now = self._clock()
        if not reason or reason == self._progress_reason or now - self._progress_at < self._progress_interval:
            return
        self._progress_reason, self._progress_at = reason, now
        self._progress = trainer_pb2.ReportJobStatusRequest(
            job_id=self.spec.job_id, attempt=self.spec.attempt, state=JobState.DEPLOYING, reason=reason,
            actor=ACTOR, learners=self._learner_statuses())

    def _deliver_progress(self) -> None:
        request = self._progress
        if request is None or self._outbox or self._stop.is_set() or self._clock() < self._next_try:
            return
        try:
            self._reporter.report(request)
        except _PERMANENT as e:
            log.warning("job %s: the Trainer refused the preparing progress: %s", self.spec.job_id, e.message)
        except Exception as e:  # noqa: BLE001 - retried like a state, unless newer progress replaces it
            self._next_try = self._clock() + self._report_backoff.next()
            log.info("job %s: reporting the preparing progress failed (%s)", self.spec.job_id, message_of(e))
            return
        self._report_backoff.reset()
        if self._progress is request:
            self._progress = None

    def _learner_statuses(self) -> list[common_pb2.LearnerStatus]:
        out = []
        for v in learner_views(self._current, self._last_seen, self.spec.slots, self.spec.attempt):
            if self.spec.elastic and not v.present and v.state == LearnerState.LEARNER_STATE_UNSPECIFIED:
                continue  # a slot of an elastic job that never had a learner
            message, state = v.message, v.state
            if v.lost:
                message = f"{message}; {_LOST}" if message else _LOST
                if self.spec.elastic:
                    state = LearnerState.LEARNER_FAILED  # it left the group (the job runs on without it)
            out.append(common_pb2.LearnerStatus(rank=v.rank, state=state, exit_code=v.exit_code or 0,
                                                attempt=self.spec.attempt, message=message,
                                                isolation=v.isolation, timed_out=v.timed_out))
        return out

    def _deliver(self) -> None:
        while self._outbox and not self._stop.is_set():
            if self._clock() < self._next_try:
                return
            request = self._outbox[0]
            state = JobState(request.state)
            try:
                self._reporter.report(request)
            except _PERMANENT as e:
                log.error("job %s: the Trainer refused %s: %s; not retrying", self.spec.job_id, state.name,
                          e.message)
            except Exception as e:  # noqa: BLE001 - any other failure: retry later
                delay = self._report_backoff.next()
                log.warning("job %s: reporting %s failed (%s); retrying in %gs", self.spec.job_id,
                            state.name, message_of(e), delay)
                self._next_try = self._clock() + delay
                return
            else:
                self._delivered.append(state)
            self._report_backoff.reset()
            self._outbox.pop(0)
        self._deliver_progress()

    def _finished(self) -> bool:
        return _final(self._reached) and not self._outbox


def _membership(learners: list[common_pb2.LearnerStatus]) -> tuple[tuple[int, int], ...]:
    """Who is in the job in which state: what an elastic job's same-state report is sent for."""
    return tuple((s.rank, s.state) for s in learners)


def _final(state: JobState) -> bool:
    """After these the attempt is over: its learners are gone, nothing more will be reported."""
    return states.is_terminal(state) or state == JobState.HALTED


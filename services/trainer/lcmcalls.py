"""The rules' `Actions` (services/trainer/rules.py): the LCM calls a transition asks for (deploy, halt, open
a gate, remove an ended attempt's learners), made by a pool of worker threads and retried with a named policy of
services/common/retry.py, so a job's record never waits on the LCM.

`LcmCalls` owns that pool, its stop event and the cleanups in flight. The wiring (services/trainer/wiring.py)
builds it first, then the rules' `Lifecycle` over it, then the Dispatcher, and last `bind`s the lifecycle (a call's
outcome moves the job: a deploy that fails, a cleanup that ends) and the Dispatcher's wake-up to it. The Dispatcher
runs its own LCM reads (the capacity, elastic grants) on the same pool through `submit`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from trainforge_services.common import states
from trainforge_services.common.errors import ResourceExhausted, TrainforgeError, Unavailable, message_of
from trainforge_services.common.retry import STEADY, Backoff, Stopped
from trainforge_services.common.states import JobState
from trainforge_services.trainer.lcm_client import Lcm
from trainforge_services.trainer.record import GATE_CLOSED, GATE_OPEN, JobRecord
from trainforge_services.trainer.resources import Quota
from trainforge_services.trainer.rules import ACTOR, Lifecycle
from trainforge_services.trainer.store import JobStore

log = logging.getLogger("trainforge_services.trainer.dispatcher")


class LcmCalls:
    """Deploy, halt, open gates and clean up through the LCM, off the caller's thread: the rules' `Actions`."""

    def __init__(self, store: JobStore, lcm: Lcm, *, kill_attempts: int = 4, kill_backoff: float = 0.5,
                 workers: int = 8):
        self._store = store
        self._lcm = lcm
        # a failing call is tried again after `kill_backoff` seconds, then ever longer (tests set it short)
        self._retry = STEADY.starting(kill_backoff)
        self._kill_retry = self._retry.within(attempts=kill_attempts)
        # a cleanup whose KillJob ran out of tries waits for the scan, from twice that on
        self._cleanup_retry = STEADY.starting(2 * kill_backoff)
        self._stopping = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trainer-lcm")
        self._lifecycle: Lifecycle | None = None
        self._wake: Callable[[], None] = _nothing
        # cleanups in flight, and when a failed one may be tried again
        self._cleaning: set[str] = set()
        self._cleaning_lock = threading.Lock()
        self._retry_at: dict[str, float] = {}
        self._backoffs: dict[str, Backoff] = {}
        self._last_cleanup_scan = 0.0

    def bind(self, lifecycle: Lifecycle, wake: Callable[[], None]) -> None:
        """The wiring's second step: the lifecycle built over these calls, and what looks at the queue again
        (the Dispatcher's `wake`)."""
        self._lifecycle = lifecycle
        self._wake = wake

    @property
    def lifecycle(self) -> Lifecycle:
        if self._lifecycle is None:
            raise RuntimeError("LcmCalls used before bind(lifecycle, wake)")
        return self._lifecycle

    def stop(self) -> None:
        """End the retries and wait for the calls in flight; an unfinished one is sent again by the next Trainer
        (`JobService.reconcile`, the cleanup scan)."""
        self._stopping.set()
        self._pool.shutdown(wait=True)

    def submit(self, fn: Callable[..., object], *args: object) -> Future | None:
        """Run `fn(*args)` on the pool (an exception is logged); None once stopping: then it does not run."""
        try:
            return self._pool.submit(_logged, fn, *args)
        except RuntimeError:
            log.warning("trainer is stopping; %s%s not run", getattr(fn, "__name__", fn), args[:1])
            return None

    # -- the rules' Actions --------------------------------------------------

    def wake(self) -> None:
        """Look at the queue again (something let go of resources, or joined the queue)."""
        self._wake()

    def deploy(self, job: JobRecord) -> None:
        """Ask the LCM to start a DEPLOYING job's attempt (idempotent on the LCM's side)."""
        self.submit(self._deploy, job)

    def halt(self, job: JobRecord) -> None:
        """Ask the LCM to halt a HALTING job's attempt (retried until it answers or the job moved on)."""
        self.submit(self._halt, job.id, job.attempt)

    def clean_up(self, job_id: str) -> None:
        """Remove a job's learners (KillJob); then the rules requeue a RESTARTING job."""
        with self._cleaning_lock:
            if job_id in self._cleaning:
                return
            self._cleaning.add(job_id)
        self.submit(self._clean_up, job_id)

    # -- for the service (a gate, a quota) and the dispatcher (the cleanup scan) --

    def open_gate(self, job: JobRecord) -> None:
        """Let a gated DEPLOYING job's learners start (retried until it answers or the job moved on)."""
        self.submit(self._open_gate, job.id, job.attempt)

    def sync_team(self, team: str, quota: Quota) -> None:
        """Tell the LCM a team's quota changed; a failure is logged (every deploy sends the team's quota too, so
        the backend's copy catches up at the team's next job)."""
        self.submit(self._lcm.sync_team, team, quota)

    def scan_cleanups(self) -> None:
        """Pick up cleanups a failed KillJob or a Trainer restart left behind (at most once a second)."""
        now = time.monotonic()
        if now - self._last_cleanup_scan < 1.0:
            return
        self._last_cleanup_scan = now
        for job in self._store.pending_cleanups():
            if self._retry_at.get(job.id, 0.0) <= now:
                self.clean_up(job.id)

    # -- on the pool ----------------------------------------------------------

    def _still(self, job_id: str, attempt: int, wanted: frozenset[JobState]) -> JobRecord | None:
        """The job if it is still on `attempt` and in one of `wanted`; None once it moved on."""
        job = self._store.find(job_id)
        return job if job is not None and job.attempt == attempt and job.state in wanted else None

    def _deploy(self, job: JobRecord) -> None:
        """Deploy one attempt; an LCM that is down or restarting is waited for, anything else fails the job.

        DeployJob is idempotent per (job, attempt), so a call whose answer was
        lost (the LCM died mid-deploy) is simply made again; the restarted LCM
        answers for an attempt its predecessor launched, and stops and launches
        again one it cut short. A capacity refusal is waited
        out too: the pass only reserves what fits the capacity the LCM
        reported, so the LCM can only be full with attempts of jobs that
        already ended and are being removed (a burst of short jobs shows it);
        failing the job for that would lose it.
        """
        job_id, attempt = job.id, job.attempt
        deploying = frozenset({JobState.DEPLOYING, JobState.HALTING})

        def call() -> list[str] | None:
            current = self._still(job_id, attempt, deploying)
            if current is None:
                return None  # moved on (cancelled, halted) while the LCM was away
            # a prestarted trial whose gate is still closed: its learners wait for OpenGate (read just now, so
            # a gate opened before this call deploys it ungated)
            gated = {"gated": True} if current.gate == GATE_CLOSED else {}
            return self._lcm.deploy_job(job_id, job.team, attempt, json.dumps(job.manifest), job.code_uri,
                                        job.checkpoint_uri, **gated)

        def waiting(e: BaseException, tries: int, delay: float) -> None:
            message = message_of(e)
            what = "LCM full" if isinstance(e, ResourceExhausted) else "LCM unavailable"
            log.warning("job %s attempt %d: %s (%s); deploying again in %gs", job_id, attempt, what,
                        message, delay)
            # the job's reason says why it waits (e.g. a docker engine that is down), not only the log
            note(f"waiting to deploy ({what}): {message}; trying again in {delay:g}s", tries)

        waited = [0]

        def note(reason: str, tries: int) -> None:  # for users only: a store error just loses the reason
            waited[0] = tries
            with contextlib.suppress(TrainforgeError):
                self._store.set_fields(job_id, {"reason": reason}, state=JobState.DEPLOYING, attempt=attempt)

        try:
            handles = self._retry.call(call, retry_on=(Unavailable, ResourceExhausted), stop_event=self._stopping,
                                       on_retry=waiting)
        except (Stopped, Unavailable, ResourceExhausted):
            return  # stopping: the next Trainer resends it (reconcile)
        except Exception as e:  # noqa: BLE001 - any other failure of the call fails the attempt
            message = message_of(e)
            log.warning("job %s attempt %d: deploy failed: %s", job_id, attempt, message)
            self.lifecycle.move(job_id, JobState.FAILED, f"deploy failed: {message}", ACTOR, attempt=attempt)
            return
        if handles is None:
            return
        log.info("job %s attempt %d deployed: %s", job_id, attempt, ", ".join(handles) or "no handles")
        if waited[0]:
            note(f"deployed after {waited[0] + 1} tries; starting", waited[0])
        current = self._store.find(job_id)
        if current is None or current.attempt != attempt:
            return
        if current.state not in states.ACTIVE:
            # ended or halted while the deploy ran: its KillJob may have come before the deploy
            self._kill(job_id, current.reason, attempt)
        elif current.state == JobState.HALTING:
            # the halt key may have been written before the deploy reset the job's etcd keys
            self._halt(job_id, attempt)
        elif current.gate == GATE_OPEN:
            # opened while this deploy ran (or before a resent one that found its gated attempt running): the
            # gate key may have come before the deploy reset the job's etcd keys, or never have been written
            self._open_gate(job_id, attempt)

    def _open_gate(self, job_id: str, attempt: int) -> None:
        """OpenGate, retried until it answers, the job leaves DEPLOYING or the Trainer stops (the next one
        resends the deploy of a DEPLOYING job, which opens the gate again)."""
        deploying = frozenset({JobState.DEPLOYING})
        tries = [0]

        def call() -> bool:
            tries[0] += 1
            if tries[0] > 1 and self._still(job_id, attempt, deploying) is None:
                return False  # running, ended or halted since: nothing waits at the gate
            self._lcm.open_gate(job_id, attempt)
            return True

        def failed(e: BaseException, tries: int, delay: float) -> None:
            log.warning("job %s: OpenGate failed: %s; retrying in %gs", job_id, message_of(e), delay)

        try:
            if self._retry.call(call, retry_on=Exception, stop_event=self._stopping, on_retry=failed):
                log.info("job %s attempt %d: gate opened", job_id, attempt)
        except Exception:  # noqa: BLE001 - only a stop ends the retries
            log.info("job %s attempt %d: gate not opened; the Trainer is stopping", job_id, attempt)

    def _halt(self, job_id: str, attempt: int) -> None:
        halting = frozenset({JobState.HALTING})

        def call() -> bool:
            if self._still(job_id, attempt, halting) is None:
                return False
            self._lcm.halt_job(job_id, attempt)
            return True

        def failed(e: BaseException, tries: int, delay: float) -> None:
            log.warning("job %s: HaltJob failed: %s; retrying in %gs", job_id, message_of(e), delay)

        try:  # retried until it answers or the Trainer stops (the next one resends it): it must reach the learners
            if self._retry.call(call, retry_on=Exception, stop_event=self._stopping, on_retry=failed):
                log.info("job %s attempt %d: halt requested", job_id, attempt)
        except Exception:  # noqa: BLE001 - only a stop ends the retries
            log.info("job %s attempt %d: halt not sent; the Trainer is stopping", job_id, attempt)

    def _clean_up(self, job_id: str) -> None:
        try:
            current = self._store.find(job_id)
            if current is None or not current.cleanup_pending:
                return
            # the attempt that ran: a HALTED job resumed before its cleanup is QUEUED as the next one already
            ran = current.attempt - 1 if current.state in (JobState.PENDING, JobState.QUEUED) else current.attempt
            if not self._kill(job_id, current.reason, max(ran, 0)):
                backoff = self._backoffs.setdefault(job_id, self._cleanup_retry.backoff())
                self._retry_at[job_id] = time.monotonic() + backoff.next()
                return
            self._backoffs.pop(job_id, None)
            self._retry_at.pop(job_id, None)
            self.lifecycle.cleaned_up(current)
        finally:
            with self._cleaning_lock:
                self._cleaning.discard(job_id)
        self.wake()

    def _kill(self, job_id: str, reason: str, attempt: int) -> bool:
        """KillJob, naming the job's current attempt (0 before its first deploy), so the LCM refuses that
        attempt's deploy if it arrives after the kill."""
        def failed(e: BaseException, tries: int, delay: float) -> None:
            log.warning("job %s: KillJob failed (try %d of %d): %s", job_id, tries, self._kill_retry.attempts,
                        message_of(e))

        try:
            killed = self._kill_retry.call(lambda: self._lcm.kill_job(job_id, reason, attempt), retry_on=Exception,
                                           stop_event=self._stopping, on_retry=failed)
        except Exception as e:  # noqa: BLE001 - tried again later; the job record is already final
            log.error("job %s: learners may still run; KillJob did not succeed (%s; tried again later)", job_id,
                      message_of(e))
            return False
        log.info("job %s: KillJob removed %d", job_id, killed)
        return True


def _nothing() -> None:
    return None


def _logged(fn: Callable[..., object], *args: object) -> None:
    """Run a pool task; an exception is logged rather than kept in a future nobody reads."""
    try:
        fn(*args)
    except Exception:
        log.exception("%s%s failed", getattr(fn, "__name__", fn), args[:1])

"""The LCM calls a transition asks for (deploy, halt, remove an ended attempt's learners), made by the
dispatcher's worker threads and retried with services/common/retry.py: a job's record never waits on the LCM.

`LcmCalls` is the dispatcher's half that talks to the LCM; `Dispatcher` (dispatcher.py) provides the
store, the LCM client, the lifecycle, the retry settings and the stop event it uses.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time

from trainforge_services.common import states
from trainforge_services.common.errors import ResourceExhausted, TrainforgeError, Unavailable
from trainforge_services.common.retry import Backoff, Stopped, retry_call
from trainforge_services.common.states import JobState
from trainforge_services.trainer.lcm_client import Lcm
from trainforge_services.trainer.record import GATE_CLOSED, GATE_OPEN, JobRecord
from trainforge_services.trainer.rules import ACTOR, Lifecycle
from trainforge_services.trainer.store import JobStore

log = logging.getLogger("trainforge_services.trainer.dispatcher")

# Most seconds between two tries of a failing KillJob, HaltJob, OpenGate or DeployJob.
_MAX_RETRY = 30.0


class LcmCalls:
    """Deploy, halt and clean up through the LCM; mixed into the Dispatcher, which sets these attributes."""

    _store: JobStore
    _lcm: Lcm
    lifecycle: Lifecycle
    _kill_attempts: int
    _kill_backoff: float
    _stopping: threading.Event
    _cleaning: set[str]
    _cleaning_lock: threading.Lock
    _retry_at: dict[str, float]
    _backoffs: dict[str, Backoff]

    def wake(self) -> None:
        raise NotImplementedError

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
            message = e.message if isinstance(e, TrainforgeError) else str(e)
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
            handles = retry_call(call, retry_on=(Unavailable, ResourceExhausted), initial=self._kill_backoff,
                                 maximum=_MAX_RETRY, stop_event=self._stopping, on_retry=waiting)
        except (Stopped, Unavailable, ResourceExhausted):
            return  # stopping: the next Trainer resends it (reconcile)
        except Exception as e:  # noqa: BLE001 - any other failure of the call fails the attempt
            message = e.message if isinstance(e, TrainforgeError) else str(e) or type(e).__name__
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
            message = e.message if isinstance(e, TrainforgeError) else str(e)
            log.warning("job %s: OpenGate failed: %s; retrying in %gs", job_id, message, delay)

        try:
            if retry_call(call, retry_on=Exception, initial=self._kill_backoff, maximum=_MAX_RETRY,
                          stop_event=self._stopping, on_retry=failed):
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
            message = e.message if isinstance(e, TrainforgeError) else str(e)
            log.warning("job %s: HaltJob failed: %s; retrying in %gs", job_id, message, delay)

        try:  # retried until it answers or the Trainer stops (the next one resends it): it must reach the learners
            if retry_call(call, retry_on=Exception, initial=self._kill_backoff, maximum=_MAX_RETRY,
                          stop_event=self._stopping, on_retry=failed):
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
                backoff = self._backoffs.setdefault(job_id, Backoff(2 * self._kill_backoff, _MAX_RETRY))
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
            message = e.message if isinstance(e, TrainforgeError) else str(e)
            log.warning("job %s: KillJob failed (try %d of %d): %s", job_id, tries, self._kill_attempts, message)

        try:
            killed = retry_call(lambda: self._lcm.kill_job(job_id, reason, attempt), retry_on=Exception,
                                attempts=self._kill_attempts, initial=self._kill_backoff, maximum=_MAX_RETRY,
                                stop_event=self._stopping, on_retry=failed)
        except Exception as e:  # noqa: BLE001 - tried again later; the job record is already final
            message = e.message if isinstance(e, TrainforgeError) else str(e) or type(e).__name__
            log.error("job %s: learners may still run; KillJob did not succeed (%s; tried again later)", job_id,
                      message)
            return False
        log.info("job %s: KillJob removed %d", job_id, killed)
        return True

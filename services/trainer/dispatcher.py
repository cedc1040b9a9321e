"""The queue's engine: turns QUEUED jobs into deployments when they fit.

A background thread runs a dispatch pass when woken (a job was submitted,
or a job let go of its resources, or a quota changed) and every `interval`
seconds as a safety net. A pass reads the queue, what ACTIVE jobs hold (in
total and per team) and the team quotas, asks services/trainer/admission.py
what fits and in which order, reserves each job that does by the atomic
QUEUED -> DEPLOYING transition, and hands the LCM call to a worker thread,
so one slow backend call never holds up the queue. Jobs that wait get their
reason and queue position refreshed; jobs that can no longer ever run (a
quota lowered below what they need) are failed with the reason.

Why admission never overshoots a quota or the capacity, under any storm of
submissions: QUEUED -> DEPLOYING is the only transition into the ACTIVE
states (services/common/states.py), and only a pass makes it, under
`_pass_lock`, one pass at a time in the one Trainer process. Everything else
can only make jobs leave ACTIVE. So the use a pass reads at its start can
only be an over-estimate while it runs, and the pass adds every job it
reserves to that use before deciding the next; its decision and its
reservations are one step as far as any other writer can tell. Submits
only insert QUEUED jobs, which the next pass sees.

The same workers remove a finished job's learners (`LCM.KillJob`), retried
with backoff, since a job's record must never wait on its cleanup.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from services.common import states
from services.common.adapters.mongo import PyMongoError
from services.common.errors import TrainforgeError, Unavailable
from services.common.states import JobState
from services.trainer import admission
from services.trainer.admission import Capacity, Plan, Queued, Usage
from services.trainer.attempts import next_attempt
from services.trainer.lcm_client import Lcm
from services.trainer.quotas import QuotaStore
from services.trainer.store import JobStore

log = logging.getLogger(__name__)

ACTOR = "trainer"
# Least seconds between the starts of two passes: a pass reads the whole queue, so under a burst of
# wake-ups (a storm of submits, many jobs ending) one pass that places many jobs beats many that place
# one each; a lone wake-up after a quiet spell still runs at once.
SPACING = 0.2
# What a pass reads of queued and of active jobs: a pass reads the whole queue, so not the manifests.
_QUEUE_FIELDS = ("team", "resources", "gpu_type", "priority", "created_at", "attempt", "reason",
                 "queue_position", "not_before", "cleanup_pending", "restarts")
# Most seconds between two tries of a failing KillJob or HaltJob.
_MAX_RETRY = 30.0
_HELD_FIELDS = ("team", "resources", "gpu_type")


class Dispatcher:
    def __init__(self, store: JobStore, lcm: Lcm, *, quotas: QuotaStore | None = None,
                 interval: float = 1.0, spacing: float = SPACING, kill_attempts: int = 4,
                 kill_backoff: float = 0.5, workers: int = 8):
        self._store = store
        self._lcm = lcm
        self._quotas = quotas
        self._interval = interval
        self._spacing = spacing
        self._kill_attempts = kill_attempts
        self._kill_backoff = kill_backoff
        # Only one Trainer process runs, so this lock is all that stops two
        # passes from spending the same free capacity. Several replicas would
        # need a reservation in the store instead: e.g. a usage document per
        # backend updated by compare-and-set together with QUEUED -> DEPLOYING.
        self._pass_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._calls = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trainer-lcm")
        self._capacity: Capacity | None = None
        self._capacity_error = "the LCM has not reported its capacity yet"
        # cleanups in flight, and when a failed one may be tried again
        self._cleaning: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._retries: dict[str, int] = {}
        self._cleaning_lock = threading.Lock()
        self._last_cleanup_scan = 0.0

    # -- lifecycle ---------------------------------------------------------

    def start(self, capacity_wait: float = 2.0) -> None:
        """Start the passes, and ask the LCM for its capacity off the caller's thread.

        Waits at most `capacity_wait` seconds for that answer, so a Trainer that
        starts beside a healthy LCM refuses a job too big for it from its first
        submit, while an LCM that is slow or down delays the start by no more
        than that (and a submit not at all: see `capacity`).
        """
        first = self._calls.submit(_logged, self._refresh_capacity)
        self._thread = threading.Thread(target=self._loop, name="trainer-dispatcher", daemon=True)
        self._thread.start()
        self.wake()
        with contextlib.suppress(TimeoutError):
            first.result(capacity_wait)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._calls.shutdown(wait=True)

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        last_pass = -self._spacing
        while not self._stopping.is_set():
            self._wake.wait(self._interval)
            self._stopping.wait(max(0.0, last_pass + self._spacing - time.monotonic()))
            self._wake.clear()
            if self._stopping.is_set():
                return
            last_pass = time.monotonic()
            try:
                self.run_once()
            except PyMongoError as e:
                log.warning("dispatch pass skipped: MongoDB: %s", e)
            except Exception:
                log.exception("dispatch pass failed")

    # -- capacity ----------------------------------------------------------

    def capacity(self) -> Capacity | None:
        """The backend's capacity as last reported (None: not known yet); never calls the LCM.

        It is asked at start and by every pass with a queue, off any request's thread.
        """
        return self._capacity

    def _refresh_capacity(self) -> Capacity | None:
        """This pass's capacity, or None when the LCM cannot say (then nothing is dispatched)."""
        try:
            self._capacity = self._lcm.get_capacity()
        except TrainforgeError as e:
            if e.message != self._capacity_error:
                log.warning("LCM capacity unknown: %s", e.message)
            self._capacity_error = e.message
            return None
        return self._capacity

    # -- one pass ----------------------------------------------------------

    def run_once(self) -> Plan:
        self._scan_cleanups()
        with self._pass_lock:
            queued = {doc["_id"]: doc
                      for doc in self._store.in_states([JobState.QUEUED], fields=_QUEUE_FIELDS)}
            held_back = self._held_back(queued, time.time())
            for job_id in held_back:
                del queued[job_id]
            if not queued:
                return Plan()
            queue = [_queued(doc) for doc in queued.values()]
            capacity = self._refresh_capacity()
            if capacity is None:
                result = admission.hold(queue, f"waiting for the LCM: {self._capacity_error}")
            else:
                active = self._store.in_states(states.ACTIVE, fields=_HELD_FIELDS)
                held = [(d["team"], Usage.from_doc(d["resources"]), d.get("gpu_type", "")) for d in active]
                in_use = admission.total(need for _, need, _ in held)
                quotas = self._quotas.all() if self._quotas is not None else {}
                result = admission.plan(queue, in_use, capacity, quotas=quotas,
                                        teams=admission.team_use(held))
            for job_id in result.dispatch:
                self._reserve(queued[job_id])
            for job_id, reason in result.reject.items():
                attempt = queued[job_id]["attempt"]
                self._store.transition(job_id, JobState.FAILED, reason, ACTOR, attempt=attempt)
            self._note_waiting(queued, result)
            return result

    def _held_back(self, queued: dict[str, dict], now: float) -> dict[str, dict]:
        """Queued jobs that may not be dispatched yet (restart backoff, previous learners not removed)."""
        held: dict[str, dict] = {}
        notes = []
        for job_id, doc in queued.items():
            if doc.get("cleanup_pending"):
                reason = "waiting for the previous attempt's learners to be removed"
            elif float(doc.get("not_before") or 0.0) > now:
                at = time.strftime("%H:%M:%S", time.localtime(float(doc["not_before"])))
                reason = f"restart {doc.get('restarts', 0)}: waiting out the backoff until {at}"
            else:
                continue
            held[job_id] = doc
            if (doc.get("reason"), doc.get("queue_position")) != (reason, 0):
                notes.append((job_id, doc["attempt"], reason, 0))
        self._store.note_queued(notes)
        return held

    def _note_waiting(self, queued: dict[str, dict], result: Plan) -> None:
        """Store the reasons and positions that changed, in one batch: a reason names the use, so most do."""
        notes = []
        for job_id, (reason, position) in result.wait.items():
            doc = queued[job_id]
            if (doc.get("reason"), doc.get("queue_position")) != (reason, position):
                notes.append((job_id, doc["attempt"], reason, position))
        self._store.note_queued(notes)

    def _reserve(self, doc: dict) -> None:
        """QUEUED -> DEPLOYING holds the resources; the deploy call happens off the pass."""
        done = self._store.apply_transition(doc["_id"], JobState.DEPLOYING, "resources reserved; deploying",
                                            ACTOR, attempt=doc["attempt"])
        if done.changed:
            self.deploy(done.doc)

    # -- LCM calls off the pass --------------------------------------------

    def deploy(self, doc: dict) -> None:
        """Ask the LCM to start a DEPLOYING job's attempt (idempotent on the LCM's side)."""
        self._submit(self._deploy, doc)

    def job_finished(self, job_id: str, reason: str = "") -> None:
        """A job let go of its resources: remove whatever runs of it and look at the queue again."""
        self.clean_up(job_id)
        self.wake()

    def halt(self, doc: dict) -> None:
        """Ask the LCM to halt a HALTING job's attempt (retried until it answers or the job moved on)."""
        self._submit(self._halt, doc["_id"], doc["attempt"])

    def clean_up(self, job_id: str) -> None:
        """Remove a job's learners (KillJob); a RESTARTING job then queues its next attempt."""
        with self._cleaning_lock:
            if job_id in self._cleaning:
                return
            self._cleaning.add(job_id)
        self._submit(self._clean_up, job_id)

    def _scan_cleanups(self) -> None:
        """Pick up cleanups a failed KillJob or a Trainer restart left behind (at most once a second)."""
        now = time.monotonic()
        if now - self._last_cleanup_scan < 1.0:
            return
        self._last_cleanup_scan = now
        for doc in self._store.pending_cleanups():
            if self._retry_at.get(doc["_id"], 0.0) <= now:
                self.clean_up(doc["_id"])

    def _submit(self, fn: Callable[..., None], *args: object) -> None:
        try:
            self._calls.submit(_logged, fn, *args)
        except RuntimeError:
            log.warning("trainer is stopping; %s%s not run", fn.__name__, args[:1])

    def _deploy(self, doc: dict) -> None:
        """Deploy one attempt; an LCM that is down or restarting is waited for, anything else fails the job.

        DeployJob is idempotent per (job, attempt), so a call whose answer was
        lost (the LCM died mid-deploy) is simply made again; the restarted LCM
        finishes what its predecessor started.
        """
        job_id, attempt = doc["_id"], doc["attempt"]
        delay = self._kill_backoff
        while True:
            try:
                handles = self._lcm.deploy_job(job_id, doc["team"], attempt, json.dumps(doc["manifest"]),
                                               doc.get("code_uri", ""), doc.get("checkpoint_uri", ""))
                break
            except Unavailable as e:
                current = self._store.find(job_id)
                if (current is None or current["attempt"] != attempt
                        or JobState(current["state"]) not in (JobState.DEPLOYING, JobState.HALTING)):
                    return  # moved on (cancelled, halted) while the LCM was away
                log.warning("job %s attempt %d: LCM unavailable (%s); deploying again in %gs", job_id, attempt,
                            e.message, delay)
                if self._stopping.wait(delay):
                    return  # the next Trainer resends it (reconcile)
                delay = min(delay * 2, _MAX_RETRY)
            except Exception as e:  # noqa: BLE001 - any other failure of the call fails the attempt
                message = e.message if isinstance(e, TrainforgeError) else str(e) or type(e).__name__
                log.warning("job %s attempt %d: deploy failed: %s", job_id, attempt, message)
                reason = f"deploy failed: {message}"
                if self._store.apply_transition(job_id, JobState.FAILED, reason, ACTOR, attempt=attempt).changed:
                    self.job_finished(job_id)
                return
        log.info("job %s attempt %d deployed: %s", job_id, attempt, ", ".join(handles) or "no handles")
        current = self._store.find(job_id)
        if current is None or current["attempt"] != attempt:
            return
        state = JobState(current["state"])
        if state not in states.ACTIVE:
            # ended or halted while the deploy ran: its KillJob may have come before the deploy
            self._kill(job_id, current.get("reason", ""))
        elif state == JobState.HALTING:
            # the halt key may have been written before the deploy reset the job's etcd keys
            self._halt(job_id, attempt)

    def _halt(self, job_id: str, attempt: int) -> None:
        delay = self._kill_backoff
        while not self._stopping.is_set():
            current = self._store.find(job_id)
            if current is None or current["attempt"] != attempt or JobState(current["state"]) != JobState.HALTING:
                return
            try:
                self._lcm.halt_job(job_id, attempt)
            except Exception as e:  # noqa: BLE001 - retried: a halt must reach the learners
                message = e.message if isinstance(e, TrainforgeError) else str(e)
                log.warning("job %s: HaltJob failed: %s; retrying in %gs", job_id, message, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, _MAX_RETRY)
                continue
            log.info("job %s attempt %d: halt requested", job_id, attempt)
            return

    def _clean_up(self, job_id: str) -> None:
        try:
            current = self._store.find(job_id)
            if current is None or not current.get("cleanup_pending"):
                return
            attempt = current["attempt"]
            if not self._kill(job_id, current.get("reason", "")):
                tries = self._retries.get(job_id, 0) + 1
                self._retries[job_id] = tries
                self._retry_at[job_id] = time.monotonic() + min(self._kill_backoff * 2 ** tries, _MAX_RETRY)
                return
            self._retries.pop(job_id, None)
            self._retry_at.pop(job_id, None)
            if JobState(current["state"]) == JobState.RESTARTING:
                self._requeue(current)
            else:
                self._store.cleanup_done(job_id, attempt)
        finally:
            with self._cleaning_lock:
                self._cleaning.discard(job_id)
        self.wake()

    def _requeue(self, doc: dict) -> None:
        """RESTARTING -> QUEUED as the next attempt, after the backoff the service chose."""
        delay = float(doc.get("restart_delay") or 0.0)
        fields = {**next_attempt(doc, not_before=time.time() + delay), "cleanup_pending": False}
        done = self._store.apply_transition(
            doc["_id"], JobState.QUEUED, f"restart {doc.get('restarts', 0)}: queued as attempt "
            f"{doc['attempt'] + 1}, from the last checkpoint", ACTOR, attempt=doc["attempt"],
            only_from=[JobState.RESTARTING], set_fields=fields)
        if not done.changed:
            self._store.cleanup_done(doc["_id"], doc["attempt"])  # cancelled meanwhile: nothing to requeue

    def _kill(self, job_id: str, reason: str) -> bool:
        for attempt in range(1, self._kill_attempts + 1):
            try:
                killed = self._lcm.kill_job(job_id, reason)
            except Exception as e:  # noqa: BLE001 - retried, then logged; the job record is already final
                message = e.message if isinstance(e, TrainforgeError) else str(e)
                log.warning("job %s: KillJob failed (try %d of %d): %s", job_id, attempt, self._kill_attempts,
                            message)
                backoff = self._kill_backoff * 2 ** (attempt - 1)
                if attempt == self._kill_attempts or self._stopping.wait(backoff):
                    break
                continue
            log.info("job %s: KillJob removed %d", job_id, killed)
            return True
        log.error("job %s: learners may still run; KillJob did not succeed (tried again later)", job_id)
        return False


def _logged(fn: Callable[..., None], *args: object) -> None:
    """Run a worker task; an exception is logged rather than kept in a future nobody reads."""
    try:
        fn(*args)
    except Exception:
        log.exception("%s%s failed", fn.__name__, args[:1])


def _queued(doc: dict) -> Queued:
    return Queued(doc["_id"], doc["team"], Usage.from_doc(doc["resources"]), int(doc.get("priority", 1)),
                  float(doc.get("created_at", 0.0)), doc.get("gpu_type") or "")

"""The queue's engine: turns QUEUED jobs into deployments when they fit. It schedules and does nothing else.

The wiring (services/trainer/wiring.py) hands it the rules' `Lifecycle`,
through which it makes every state change, and the `LcmCalls`
(services/trainer/lcmcalls.py) the rules act through, whose pool also runs
its own LCM reads off the pass (the capacity, elastic grants).

Three threads share the work, so that a pass never waits on the store
(the first two are `Loop`s of services/common/loop.py, paced and run only
while this replica leads):
- the reader (`_read_step`), when woken (a submit, a job that let go of its
  resources, a quota change) and every `interval` seconds, reads what changed
  into the copy of the queued and active jobs (jobmirror.py), and the quotas
  when their copy is getting old; then it asks for a pass;
- the pass (`_pass_step`) decides on that copy: admission.py says what fits
  and in which order; each job that does counts as reserved at once
  (`JobMirror.reserve`) and goes to the writer. Waiting jobs' reasons and
  positions go to queuenotes.py; jobs that can never run (a quota lowered
  below their need) are failed with the reason. A team may borrow in its
  cohort (cohorts.py); waiting jobs may have running ones halted for them
  (preemptor.py);
- the writer (reserver.py) makes the QUEUED -> DEPLOYING moves in the order
  decided; the Deploy rule then hands the LCM call to the pool, so a job is
  deployed only once its reservation is written.

Why admission never overshoots a quota or the capacity, under any storm of
submissions: QUEUED -> DEPLOYING is the only transition into the ACTIVE
states (services/common/states.py), and only the writer makes it, for what a
pass decided under `_pass_lock`, one pass at a time in the one Trainer that
leads (among replicas, services/trainer/fence.py keeps a deposed leader's
reservations from being written). Everything else can only make jobs leave
ACTIVE. So the use the copy shows can only be an over-estimate, as long as
every reservation a pass decided counts in it from that moment on: the copy
counts it as held (and not as queued) until its write has returned and a read
that began after that has read the job back, whatever an earlier read, which
may have overlapped the write, says. A pass adds every job it reserves to the
use before deciding the next; later passes see them in the copy. A write that
fails leaves the job counted until such a read says where it is (still QUEUED:
a later pass reserves it again). Submits only insert QUEUED jobs, which the
next read sees.

The LCM calls a transition asks for (services/trainer/rules.py decides
which: deploy, halt, remove an ended attempt's learners) are `LcmCalls`'s,
never the dispatcher's. What a transition means lives in the rules, not
here: every state change the dispatcher makes goes through `Lifecycle.move`.
`run_once` does one read, one pass and its writes in the caller's thread (the
tests' way in).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time

from trainforge_services.common.errors import Unavailable
from trainforge_services.common.loop import Loop
from trainforge_services.common.observability import LabelCounts
from trainforge_services.common.states import JobState
from trainforge_services.trainer import admission, cohorts
from trainforge_services.trainer.admission import Plan
from trainforge_services.trainer.capacity import CapacityCache
from trainforge_services.trainer.fence import Deposed, FenceGate
from trainforge_services.trainer.growth import FIELDS as _GROWTH_FIELDS
from trainforge_services.trainer.growth import Grower
from trainforge_services.trainer.jobmirror import JobMirror
from trainforge_services.trainer.lcm_client import Lcm
from trainforge_services.trainer.lcmcalls import LcmCalls
from trainforge_services.trainer.preemption import Policy
from trainforge_services.trainer.preemptor import FIELDS as _PREEMPT_FIELDS
from trainforge_services.trainer.preemptor import Preemptor
from trainforge_services.trainer.queuenotes import QueueNotes
from trainforge_services.trainer.quotas import QUOTA_MAX_AGE, QuotaStore
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.reserver import Reservations, ReservationWriter
from trainforge_services.trainer.resources import BackendSize, Usage
from trainforge_services.trainer.rules import ACTOR, Lifecycle
from trainforge_services.trainer.stamps import STAMPS
from trainforge_services.trainer.store import JobStore

log = logging.getLogger(__name__)

# Most seconds between the starts of two passes when woken: a pass reads the whole queue, so under a
# burst of wake-ups (a storm of submits, many jobs ending) one pass that places many jobs beats many that
# place one each. The gap actually kept is twice the last pass's duration within [MIN_SPACING, SPACING]:
# cheap passes (a short queue) follow each other closely, so a submit right after another job's end is
# not held back by a fixed gap; a lone wake-up after a quiet spell still runs at once.
SPACING = 0.2
MIN_SPACING = 0.05
# The reader reads the quotas again once its copy is this old, so that a pass seldom finds it out of date
# (services/trainer/quotas.py) and reads them itself.
QUOTA_READ_AHEAD = QUOTA_MAX_AGE / 2
# What a pass reads of queued and of active jobs: a pass reads the whole queue, so not the manifests.
_QUEUE_FIELDS = ("team", "resources", "gpu_type", "priority", "created_at", "attempt", "reason",
                 "queue_position", "not_before", "cleanup_pending", "restarts", "fence")
_HELD_FIELDS = ("team", "resources", "gpu_type", *_PREEMPT_FIELDS, *_GROWTH_FIELDS)


# The admission passes' decisions in this process, by decision and reason kind ("held" per job and pass):
# exported as trainforge_admission_decisions_total (services/trainer/wiring.py).
ADMISSIONS = LabelCounts()


class Dispatcher:
    """Schedules: the admission passes, their threads and the capacity cache."""

    def __init__(self, store: JobStore, lcm: Lcm, lifecycle: Lifecycle, calls: LcmCalls, *,
                 quotas: QuotaStore | None = None, interval: float = 1.0, spacing: float = SPACING,
                 preemption: Policy | None = None, gate: FenceGate | None = None):
        self._store = store
        self._quotas = quotas
        self._lifecycle = lifecycle
        self._calls = calls
        # halts running jobs for waiting ones that may take their place (services/trainer/preemptor.py)
        self._preemptor = Preemptor(store, lifecycle, preemption or Policy())
        # This lock stops two passes of this process from spending the same free capacity; among
        # replicas, only the elected one runs passes, and `gate` fences its reservations in the store
        # (services/trainer/fence.py). No gate: the only replica.
        self._pass_lock = threading.Lock()
        self._decided = 0.0  # when the running pass had decided (before handing its reservations on)
        self._gate = gate
        # wake-ups go to the reader (read what changed), which then asks for a pass; both run while this
        # replica leads, spaced by twice their last duration within [MIN_SPACING, spacing]
        stopping, spaced = threading.Event(), (min(MIN_SPACING, spacing), spacing)
        leading = None if gate is None else (lambda: gate.leading)  # a follower neither reads nor passes
        self._reader = Loop("trainer-jobcopy", self._read_step, interval=interval, spacing=spaced, when=leading,
                            stopping=stopping)
        self._passes = Loop("trainer-dispatcher", self._pass_step, interval=interval, spacing=spaced,
                            when=leading, stopping=stopping)
        self._read_lock = threading.Lock()  # one read of what changed at a time
        self._reread: set[str] | None = set()  # jobs read again since the last pass took them (None: all)
        self._reread_lock = threading.Lock()
        self._last_read = (0, 0.0)  # (jobs, ms) of the last read of what changed
        self._notes = QueueNotes(store)
        # the queued and active jobs as of the last pass, kept from what changed (jobmirror.py)
        # without a gate this is the only replica, the only writer of the jobs: the copy reads each change
        # about once (stamps.py)
        self._jobs = JobMirror(store, dict.fromkeys([*_QUEUE_FIELDS, *_HELD_FIELDS]),
                               settled=STAMPS.settled if gate is None else None)
        # writes each pass's reservations, in the order decided (reserver.py)
        self._writer = ReservationWriter(lifecycle, self._jobs)
        self._mirror_term: int | None = None
        self._capacity = CapacityCache(lcm)
        # grants elastic jobs room no queued job waits for (services/trainer/growth.py)
        self._grower = Grower(store, lcm, calls.submit)

    # -- threads -----------------------------------------------------------

    def start(self, capacity_wait: float = 2.0) -> None:
        """Start the passes, and ask the LCM for its capacity off the caller's thread.

        Waits at most `capacity_wait` seconds for that answer, so a Trainer that
        starts beside a healthy LCM refuses a job too big for it from its first
        submit, while an LCM that is slow or down delays the start by no more
        than that (and a submit not at all: see `capacity`).
        """
        first = self._calls.submit(self._capacity.refresh)
        self._notes.start()
        self._writer.start()
        self._reader.start()
        self._passes.start()
        if first is not None:
            with contextlib.suppress(TimeoutError):
                first.result(capacity_wait)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the passes, then write what they decided (its deploys go to the `LcmCalls`, which the wiring
        stops after this)."""
        self._reader.stop(timeout)
        self._passes.stop(timeout)
        self._writer.stop(timeout)  # after the last pass: what was decided is written
        self._notes.stop(timeout)
        self._jobs.close(timeout)

    def wake(self) -> None:
        self._reader.wake()

    def _read_step(self) -> None:
        """The reader's: read what changed into the copy, then ask for a pass."""
        try:
            self._calls.scan_cleanups()
            self._refresh()
        except Unavailable as e:
            log.warning("reading the queue: %s", e.message)
            return
        except Exception:
            log.exception("reading the queue failed")
            return
        self._passes.wake()

    def _pass_step(self) -> None:
        """The passes': one pass on the copy as last read; its reservations go to the writer."""
        try:
            _, writes = self._run_pass()
            if writes is not None:
                self._writer.hand(writes)
        except Deposed as e:
            log.warning("dispatch pass stopped: %s", e.message)
        except Unavailable as e:
            log.warning("dispatch pass skipped: %s", e.message)
        except Exception:
            log.exception("dispatch pass failed")

    def _refresh(self) -> None:
        """Read what changed into the copy (jobmirror.py); the first read of a new leader's term reads all."""
        with self._read_lock:
            started = time.perf_counter()
            # a replica that just became the leader reads everything once: its copy may be from an older term
            term_now = self._gate.term if self._gate is not None else None
            changed = self._jobs.refresh(full=term_now != self._mirror_term)
            self._mirror_term = term_now
            if self._quotas is not None:
                self._quotas.all(max_age=QUOTA_READ_AHEAD)  # so that a pass seldom reads them itself
        with self._reread_lock:
            if changed is None or self._reread is None:
                self._reread = None
            else:
                self._reread |= changed
            n = len(changed) if changed is not None else -1
            self._last_read = (n, (time.perf_counter() - started) * 1000)

    # -- capacity ----------------------------------------------------------

    def capacity(self) -> BackendSize | None:
        """The backend's capacity as last reported (None: not known yet); never calls the LCM.

        It is asked at start and by passes with a queue (services/trainer/capacity.py), off any
        request's thread.
        """
        return self._capacity.value

    def capacity_viewed(self) -> BackendSize | None:
        """`capacity()` for an admin's view; an unknown answer, or one older than the cache's TTL, is asked
        for again off this thread, so the next view shows what the LCM says now (its NetworkPolicy canary's
        verdict too), though no pass asks while nothing is queued."""
        self._capacity.ask_if_stale(self._calls.submit)
        return self._capacity.value

    @property
    def sole_writer(self) -> bool:
        """Whether this Trainer is the only one writing the jobs (no leader election, so no gate): then
        `STAMPS.settled()` covers every job write (services/trainer/stamps.py)."""
        return self._gate is None

    @property
    def capacity_problem(self) -> str:
        """Why the capacity is not known when `capacity()` is None."""
        return self._capacity.problem

    # -- one pass ----------------------------------------------------------

    def run_once(self) -> Plan:
        """Read what changed, run a pass on it and wait until its reservations are written (and handed to
        the rules: deploys go to the LCM pool): what the threads do in turn, in the caller's thread."""
        self._calls.scan_cleanups()
        self._refresh()
        result, writes = self._run_pass()
        if writes is not None:
            self._writer.hand(writes)  # after those of earlier passes
            writes.done.wait()
        return result

    def _run_pass(self) -> tuple[Plan, Reservations | None]:
        with self._pass_lock:
            started = self._decided = time.perf_counter()
            cpu = time.thread_time()
            with self._reread_lock:
                reread, self._reread = self._reread, set()
                read_jobs, read_ms = self._last_read
            result, writes = self._pass(reread)
            if result.dispatch or result.wait or result.reject:
                # the timing line bench/burst.py and bench/scale_sim.py read: the whole pass on the copy of the
                # jobs (its reservations are written after it, by the writer thread, which logs its own line),
                # and the part before it hands them on; then the last read of what changed (by the reader
                # thread, before the pass), the reservations of earlier passes not yet written, and the CPU
                # this thread used (wall far above it: the pass waited for a core, or on the store)
                ended = time.perf_counter()
                log.info("admission pass: %d queued, %d dispatched in %.1f ms (decided in %.1f ms); "
                         "read %d jobs in %.1f ms, cpu %.1f ms; %d reservations not yet written",
                         len(result.dispatch) + len(result.wait) + len(result.reject), len(result.dispatch),
                         (ended - started) * 1000, (self._decided - started) * 1000,
                         read_jobs, read_ms, (time.thread_time() - cpu) * 1000, self._jobs.pending)
            return result, writes

    def _pass(self, reread: set[str] | None) -> tuple[Plan, Reservations | None]:
        """One admission pass on the copy as last read; the caller holds `_pass_lock`. Its reservations go to the
        writer thread (returned, None: none), and count as made for every later pass until read back."""
        self._notes.read_again(reread)
        copy = self._jobs.snapshot()
        queued = copy.queued
        held_back = self._held_back(queued, time.time())
        for job_id, job in held_back.items():
            del queued[job_id]
            ADMISSIONS.add("held", "cleanup" if job.cleanup_pending else "backoff")
        if not queued:
            if not held_back:
                self._grow_idle(copy.active)
            return Plan(), None
        waiting = [copy.as_queued[job_id] for job_id in queued]
        # after reading the queue, so a newer leader's stamp covers every job read (fence.py)
        term = self._gate.confirm() if self._gate is not None else None
        capacity = self._capacity.current(self._calls.submit)
        quotas = self._quotas.all() if self._quotas is not None and capacity is not None else {}
        if capacity is None:
            result = admission.hold(waiting, f"waiting for the LCM: {self._capacity.problem}")
        else:
            active = list(copy.active.values())
            held = [(j.team, j.holds, j.gpu_type) for j in active]
            # a team's quota with what borrowing in its cohort allows (services/trainer/cohorts.py)
            # learners of ended jobs still count until KillJob removed them: the LCM counts them too
            in_use = admission.total([*(need for _, need, _ in held),
                                      *(j.holds for j in copy.releasing.values())])
            result = admission.plan(waiting, in_use, capacity,
                                    quotas=cohorts.ceilings(quotas), teams=admission.team_use(held),
                                    fit=cohorts.Book(quotas, {}).fit)
        self._decided = time.perf_counter()
        writes = None
        if result.dispatch:
            # QUEUED -> DEPLOYING holds the resources, counted as held from here on (`reserve`); the writer
            # makes the move, and the Deploy rule then hands the LCM call to a worker
            writes = Reservations(term, time.perf_counter())
            for job_id in result.dispatch:
                job = queued[job_id]
                fields = cohorts.dispatched(result.borrowed.get(job_id), quotas.get(job.team))
                self._jobs.reserve(job_id, job.model_copy(update={**fields, "state": JobState.DEPLOYING,
                                                                  "grown": Usage(), "grown_since": None}))
                writes.moves.append((job, fields))
        if capacity is not None:  # halt running jobs that waiting ones may displace
            self._preemptor.consider(result, queued, active, quotas, capacity, copy.as_queued)
            # growth is for elastic jobs: without one running there is nothing to grant or to send
            if not held_back and any(j.max_learners for j in active):
                self._grower.run(active, capacity, quotas, fence=term,
                                 waiting=[(queued[j].team, admission.reason_kind(r)) for j, (r, _) in result.wait.items()],
                                 extra=[(queued[j].team, queued[j].resources, queued[j].gpu_type)
                                        for j in result.dispatch])
        for job_id, reason in result.reject.items():
            self._jobs.reserve(job_id, None)
            done = self._lifecycle.move(job_id, JobState.FAILED, reason, ACTOR, attempt=queued[job_id].attempt,
                                       fence=term, seen=queued[job_id])
            self._jobs.written(job_id, done.job)
        # handing the reasons and positions to the note writer (queuenotes.py): storing them is not the pass's
        self._notes.tell((queued[j], reason, position) for j, (reason, position) in result.wait.items())
        self._notes.forget_gone(queued)
        ADMISSIONS.add("dispatched", "", n=len(result.dispatch))
        ADMISSIONS.add("rejected", "never_fits", n=len(result.reject))
        kinds = collections.Counter(admission.reason_kind(reason) for reason, _ in result.wait.values())
        for kind, n in kinds.items():
            ADMISSIONS.add("held", kind, n=n)
        return result, writes

    def _grow_idle(self, held: dict[str, JobRecord]) -> None:
        """An empty queue: elastic jobs may grow into what is free (services/trainer/growth.py)."""
        active = list(held.values())  # the leader's copy, as the pass read it
        if not any(j.max_learners for j in active):
            return
        term = self._gate.confirm() if self._gate is not None else None
        capacity = self._capacity.current(self._calls.submit)
        if capacity is not None:
            self._grower.run(active, capacity, self._quotas.all() if self._quotas is not None else {}, fence=term)

    def _held_back(self, queued: dict[str, JobRecord], now: float) -> dict[str, JobRecord]:
        """Queued jobs that may not be dispatched yet (JobRecord.held_back), told why."""
        why = {job_id: reason for job_id, job in queued.items() if (reason := job.held_back(now))}
        self._notes.tell((queued[job_id], reason, 0) for job_id, reason in why.items())
        return {job_id: queued[job_id] for job_id in why}

"""The dispatcher's copy of the QUEUED and ACTIVE jobs, kept from what changed instead of read whole each pass.

An admission pass needs every queued job and what every active job holds.
Reading them whole from the store each pass costs a round trip that grows
with the queue (10,000 queued: most of a pass, and most of the store's CPU).
So the leader keeps them here and, before each pass, reads only the jobs
whose `changed_at` moved since its last read (the store stamps it on every
insert, transition and cleanup; services/trainer/store.py `changed_since`),
going back `MARGIN` seconds further, so a write whose time was taken before
the last read but committed after it is still seen. Queue notes (reasons,
positions) do not stamp it: they change nothing a pass decides on.

What this copy may get wrong, and why that is safe:
- A job that left QUEUED or ACTIVE after the read is still here: a pass may
  try to reserve it, and that compare-and-set fails (services/trainer/
  store.py); an ACTIVE job still counted is an over-estimate of the use.
- Only a pass moves a job into ACTIVE (QUEUED -> DEPLOYING), and the pass
  records its own moves here at once (`moved`), so the use is never
  under-estimated.
- A job that left ACTIVE with `cleanup_pending` (its learners not removed
  yet: KillJob has not answered) is kept in `releasing` until a read shows
  the flag cleared: the LCM counts those learners until they are gone, so
  the pass counts them against the backend's capacity too (not against the
  team's quota, which is free at once). A stale entry only delays a
  dispatch until the next read; without it the pass would dispatch into a
  slot the LCM still holds, and the deploy would wait out a retry backoff.
- Going back `MARGIN` on every read costs a burst dearly: at 50 submits/s
  each pass read ~250 jobs inserted in the last 5 s again (the store loads
  each whole document to project it), several times a second. A pass reads
  from `SHORT_MARGIN` before its last read, and at most every `WIDE_EVERY`
  seconds one read goes back `MARGIN` before the start of the previous such
  read, so a write committed at most `MARGIN` after its stamp is still seen,
  within `WIDE_EVERY` seconds. Missing a write for that long is safe by the
  points above (a queued job dispatched later, a freed job counted a little
  longer, a stale reservation refused by its compare-and-set).
- Where this Trainer is the only writer of the jobs (no leader election),
  `settled` (services/trainer/stamps.py) tells the copy a time before which
  every one of its writes was acknowledged, taken just before each read: the
  next read goes back to it (less `EXACT_MARGIN`, for the wall clock's small
  steps) and no further, and no read goes back `MARGIN`; when the clock
  stepped back further than that, the next read is a full one. Each job is read
  about once per change instead of on every pass for 1-7 s after it: in a
  burst of 120 submits/s with 300 queued the pass's read took 48-86 ms (the
  store loads every matching document, ~0.3 ms each), nearly all of the pass.
  A write by another process (a script writing the store directly) is still
  seen if it committed within `EXACT_MARGIN` of its stamp, else at the next
  full read.
- A write delayed past `MARGIN` (a writer's clock behind, a stall) is
  missed until the next full read, at most `RESYNC` seconds later (or
  `RESYNC_FACTOR` times as long as the last full read took, if longer: on a
  store so loaded that a full read takes many seconds, passes must not turn
  into full reads), and at the first pass after this replica became the
  leader (`refresh(full=True)`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from trainforge_services.common import states
from trainforge_services.common.states import JobState
from trainforge_services.trainer.admission import Queued
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.store import JobStore

MARGIN = 5.0
SHORT_MARGIN = 1.0
WIDE_EVERY = 2.0
RESYNC = 30.0
RESYNC_FACTOR = 20
EXACT_MARGIN = 0.1


class JobMirror:
    def __init__(self, store: JobStore, fields: Iterable[str], *, margin: float = MARGIN, resync: float = RESYNC,
                 clock: Callable[[], float] = time.time, short_margin: float = SHORT_MARGIN,
                 wide_every: float = WIDE_EVERY, settled: Callable[[], float] | None = None):
        self._store = store
        self._fields = tuple(fields)
        self._margin, self._resync, self._clock = margin, resync, clock
        self._short, self._wide_every = min(short_margin, margin), wide_every
        self._wide_since = 0.0  # when the last read that went back `margin` started
        self.queued: dict[str, JobRecord] = {}
        # each queued job as admission sees it, made once per change rather than once per pass
        self.as_queued: dict[str, Queued] = {}
        self.active: dict[str, JobRecord] = {}
        # jobs out of ACTIVE whose learners KillJob has not removed yet (what they hold is still in use)
        self.releasing: dict[str, JobRecord] = {}
        self._since: float | None = None  # when the last read started
        self._full_at = 0.0
        self._full_took = 0.0
        # this process's writes as the only ones (stamps.py): reads go back to what the last one had settled
        self._settled = settled
        self._settled_at = 0.0  # what `settled` said just before the last read

    def refresh(self, full: bool = False) -> set[str] | None:
        """Bring the copy up to date: only what changed, or everything when `full`, never read, or stale.

        The ids of the jobs read again (None: all were)."""
        started = self._clock()
        settled = self._settled() if self._settled is not None else 0.0
        # the wall clock stepped back: writes since then carry stamps before the last read's
        stepped_back = settled < self._settled_at - EXACT_MARGIN
        if full or self._since is None or stepped_back or \
                started - self._full_at >= max(self._resync, RESYNC_FACTOR * self._full_took):
            jobs = self._store.in_states([JobState.QUEUED, *states.ACTIVE], fields=self._fields)
            jobs += self._store.pending_cleanups(fields=self._fields)  # an ACTIVE one twice: the same record
            self.queued, self.active, self.as_queued, self.releasing = {}, {}, {}, {}
            self._full_at, self._full_took = started, self._clock() - started
            self._wide_since = started
            changed = None
        elif self._settled is not None:
            jobs = self._store.changed_since(self._settled_at - EXACT_MARGIN, fields=self._fields)
            changed = {job.id for job in jobs}
        else:
            wide = started - self._wide_since >= self._wide_every
            since = self._wide_since - self._margin if wide else self._since - self._short
            jobs = self._store.changed_since(since, fields=self._fields)
            if wide:
                self._wide_since = started
            changed = {job.id for job in jobs}
        for job in jobs:
            self._put(job)
        self._since, self._settled_at = started, settled
        return changed

    def moved(self, job_id: str, job: JobRecord | None) -> None:
        """A pass's own transition of `job_id`: `job` as it is now (None: it is not where the pass thought)."""
        self.queued.pop(job_id, None)
        self.as_queued.pop(job_id, None)
        if job is not None:
            self._put(job)

    def _put(self, job: JobRecord) -> None:
        self.queued.pop(job.id, None)
        self.as_queued.pop(job.id, None)
        self.active.pop(job.id, None)
        self.releasing.pop(job.id, None)
        if job.cleanup_pending and job.state not in states.ACTIVE:
            self.releasing[job.id] = job
        if job.state == JobState.QUEUED:
            self.queued[job.id] = job
            self.as_queued[job.id] = job.queued()
        elif job.state in states.ACTIVE:
            self.active[job.id] = job

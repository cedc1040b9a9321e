"""The dispatcher's copy of the QUEUED and ACTIVE jobs, kept from what changed instead of read whole each pass.

An admission pass needs every queued job and what every active job holds.
Reading them whole from the store each pass costs a round trip that grows
with the queue (10,000 queued: most of a pass, and most of the store's CPU).
So the leader keeps them here and, before each pass, reads only the jobs
whose `changed_at` moved since its last read (the store stamps it on every
insert, transition and cleanup; services/trainer/store_reads.py `changed_since`),
going back `MARGIN` seconds further, so a write whose time was taken before
the last read but committed after it is still seen. Queue notes (reasons,
positions) do not stamp it: they change nothing a pass decides on.

What this copy may get wrong, and why that is safe:
- A job that left QUEUED or ACTIVE after the read is still here: a pass may
  try to reserve it, and that compare-and-set fails (services/trainer/
  store.py); an ACTIVE job still counted is an over-estimate of the use.
- Only a pass moves a job into ACTIVE (QUEUED -> DEPLOYING), and the pass
  records its own moves here at once (`reserve`, before they are written),
  so the use is never under-estimated.
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

The copy is shared by three threads of the dispatcher (services/trainer/
dispatcher.py): the reader brings it up to date (`refresh`, which calls the
store outside the lock), the passes decide on a `snapshot`, and the writer
makes their reservations. A reservation is counted as held (and not queued)
from the moment a pass decides it (`reserve`) until its write has returned
(`written`) and a read that began after that has been applied: a read that
began before may still hold the job as QUEUED, and, applied after the write,
would put it back in the queue and its room back in the free capacity, which
a later pass would then give away twice. A read that began after the write
returned holds what the write made (services/trainer/stamps.py: it reads
every write this process had acknowledged), or, among replicas, what the
margins above make likely. A write that failed (the store unreachable) may
or may not have been applied: the job counts as reserved until such a read.

The periodic full read is not a pass's (`background`, the default): once it
is due, a read of what changed starts it on a thread of its own, in pages
(services/trainer/fullread.py says how and why). Reads of what changed go on
meanwhile; the first one after it finished merges it into the copy
(`_merge`), job by job, by `changed_at`:
- a job in both keeps the newer of the two: the read's is older when a pass
  read (or made) a change after the read had passed that job;
- a job only in the read is taken, unless it left the copy during the read
  with a stamp at least as new (`_gone`: read out of QUEUED/ACTIVE, or moved
  out by a pass, stamped with the time of that move): a job cancelled or
  dispatched while the read went on is not brought back;
- a job only in the copy is dropped if its stamp is older than where every
  write was already visible when the read started: `settled` then, less
  `EXACT_MARGIN` (the only writer), or the start less `MARGIN`. A write
  stamped before that committed before the read began, so a job it left
  QUEUED or ACTIVE would have been read; not read, it has left since (by a
  write the reads of what changed missed, the case full reads are for). A
  newer entry is kept: it may have entered after its page was read.
Why that still cannot over-admit: the pages read each job as it was at some
moment during the read, and the merge never replaces an entry with an older
version of the same job, so each entry it leaves is what the store held at
some moment since the previous full read, as with any read of what changed.
A pass's own reservation (QUEUED -> DEPLOYING) is recorded with its write's
stamp, newer than any version the pages can hold from before it, so it is
kept in ACTIVE; a job the read still shows QUEUED after a pass moved it out
is held back by `_gone`. What a merge can get wrong is what a read of what
changed can get wrong: an entry staying after the job left (a use counted
too long, a reservation whose compare-and-set fails) until a later read. A
job whose stamp goes back (another writer's clock behind) may be passed over
by the pages; it is then only in the copy, kept or dropped as above, and
seen again at its next change or full read. A full read that failed is tried
again at the next read; one not finished when a full read is asked for
(taking the lead, a clock stepped back) is dropped, and that one is read
synchronously, as the first read is.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainforge_services.common import states
from trainforge_services.common.states import JobState
from trainforge_services.trainer.fullread import LIVE, PAGE, PAGE_PAUSE, FullRead
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.resources import Queued
from trainforge_services.trainer.store import JobStore

log = logging.getLogger(__name__)

MARGIN = 5.0
SHORT_MARGIN = 1.0
WIDE_EVERY = 2.0
RESYNC = 30.0
RESYNC_FACTOR = 20
EXACT_MARGIN = 0.1


class JobMirror:
    def __init__(self, store: JobStore, fields: Iterable[str], *, margin: float = MARGIN, resync: float = RESYNC,
                 clock: Callable[[], float] = time.time, short_margin: float = SHORT_MARGIN,
                 wide_every: float = WIDE_EVERY, settled: Callable[[], float] | None = None,
                 background: bool = True, page: int = PAGE, page_pause: float = PAGE_PAUSE):
        self._store = store
        self._fields = tuple(dict.fromkeys([*fields, "changed_at"]))
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
        # the periodic full read off the passes: the one under way, and what left the copy since it started
        self._background, self._page, self._page_pause = background, page, page_pause
        self._reading: FullRead | None = None
        self._dropped: list[FullRead] = []  # reads stopped before their end, until they have ended
        self._gone: dict[str, float] = {}
        # A pass's reservations not yet written, or written after the read the copy last took began: by job id,
        # what the passes count the job as (None: nothing, it is not queued) and when its write returned
        # (time.monotonic(); None: not yet). The module's docstring says why.
        self._pending: dict[str, list] = {}
        # the copy is read by the passes, updated by the reads and by the writes of reservations, each on a
        # thread of its own; the store is never called under it
        self._lock = threading.RLock()

    def refresh(self, full: bool = False) -> set[str] | None:
        """Bring the copy up to date: only what changed, or everything when `full`, never read, or stale.

        The ids of the jobs read again (None: all were). A full read that is
        only due (`RESYNC`) runs in the background and is merged by a later
        call; the ids the merge changed are among those that call returns.
        One thread at a time calls it; the store is read outside the lock the
        passes take, so a pass never waits for a read."""
        began = time.monotonic()
        started = self._clock()
        settled = self._settled() if self._settled is not None else 0.0
        # the wall clock stepped back: writes since then carry stamps before the last read's
        stepped_back = settled < self._settled_at - EXACT_MARGIN
        due = started - self._full_at >= max(self._resync, RESYNC_FACTOR * self._full_took)
        whole = full or self._since is None or stepped_back or (due and not self._background)
        wide = False
        if whole:
            with self._lock:
                self._drop_reading()
            jobs = self._store.in_states(list(LIVE), fields=self._fields)
            jobs += self._store.pending_cleanups(fields=self._fields)  # an ACTIVE one twice: the same record
            self._full_at, self._full_took = started, self._clock() - started
            self._wide_since = started
        elif self._settled is not None:
            jobs = self._store.changed_since(self._settled_at - EXACT_MARGIN, fields=self._fields)
        else:
            wide = started - self._wide_since >= self._wide_every
            since = self._wide_since - self._margin if wide else self._since - self._short
            jobs = self._store.changed_since(since, fields=self._fields)
            if wide:
                self._wide_since = started
        with self._lock:
            if whole:
                self.queued, self.active, self.as_queued, self.releasing = {}, {}, {}, {}
            for job in jobs:
                self._put(job)
            # a reservation written before this read began is in what it read
            self._pending = {j: held for j, held in self._pending.items() if held[1] is None or held[1] >= began}
            self._since, self._settled_at = started, settled
            if whole:
                return None
            changed = {job.id for job in jobs}
            reading = self._reading
            if reading is not None and reading.done.is_set():
                self._reading = None
                if reading.jobs is not None:
                    changed |= self._merge(reading)
                    self._full_at, self._full_took = reading.started, reading.took
                else:
                    log.warning("job copy: the full read failed (%s); tried again at the next read", reading.error)
                self._gone = {}
            elif reading is None and due:
                visible = settled - EXACT_MARGIN if self._settled is not None else started - self._margin
                self._reading = FullRead(self._store, self._fields, started, visible, self._page, self._page_pause)
                self._gone = {}
                self._reading.start()
            return changed

    def snapshot(self) -> Snapshot:
        """The copy as a pass decides on it: each reservation not yet read back counted as the pass made it
        (ACTIVE, not queued), whatever an older read says."""
        with self._lock:
            pending = self._pending
            if not pending:
                return Snapshot(dict(self.queued), dict(self.as_queued), dict(self.active), dict(self.releasing))
            queued = {j: job for j, job in self.queued.items() if j not in pending}
            as_queued = {j: q for j, q in self.as_queued.items() if j not in pending}
            active = {j: job for j, job in self.active.items() if j not in pending}
            active.update((j, held[0]) for j, held in pending.items() if held[0] is not None)
            return Snapshot(queued, as_queued, active, dict(self.releasing))

    def reserve(self, job_id: str, job: JobRecord | None) -> None:
        """A pass decided to move `job_id` and the write is not made yet: count it as `job` (None: nowhere)."""
        with self._lock:
            self._pending[job_id] = [job, None]

    def written(self, job_id: str, job: JobRecord | None, *, known: bool = True) -> None:
        """The write of a reserved move returned: `job` as it is now (None: not where the pass thought).
        `known=False`: the write failed and may or may not have been applied; the job counts as reserved
        until a read that began after now says what became of it."""
        with self._lock:
            held = self._pending.get(job_id)
            if known:
                self.moved(job_id, job)
                if held is not None:
                    held[0] = job if job is not None and job.state in states.ACTIVE else None
            if held is not None:
                held[1] = time.monotonic()

    @property
    def pending(self) -> int:
        """Reservations whose write has not returned yet."""
        with self._lock:
            return sum(1 for held in self._pending.values() if held[1] is None)

    @property
    def reading(self) -> bool:
        """Whether a background full read was started and not merged yet."""
        return self._reading is not None

    def wait_read(self, timeout: float) -> bool:
        """Wait until the background full read under way, if any, has finished (not merged: the next
        `refresh` does that); whether it has."""
        reading = self._reading
        return reading is None or reading.done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop a background full read under way (what it read is dropped)."""
        with self._lock:
            self._drop_reading()
        for reading in self._dropped:
            reading.join(timeout)
        self._dropped = []

    def moved(self, job_id: str, job: JobRecord | None) -> None:
        """A pass's own transition of `job_id`: `job` as it is now (None: it is not where the pass thought)."""
        with self._lock:
            self._moved(job_id, job)

    def _moved(self, job_id: str, job: JobRecord | None) -> None:
        self._left(job_id, job.changed_at if job is not None else self._clock())
        self.queued.pop(job_id, None)
        self.as_queued.pop(job_id, None)
        if job is not None:
            self._put(job)

    def _put(self, job: JobRecord) -> None:
        self.queued.pop(job.id, None)
        self.as_queued.pop(job.id, None)
        self.active.pop(job.id, None)
        self.releasing.pop(job.id, None)
        live = False
        if job.cleanup_pending and job.state not in states.ACTIVE:
            self.releasing[job.id] = job
            live = True
        if job.state == JobState.QUEUED:
            self.queued[job.id] = job
            self.as_queued[job.id] = job.queued()
            live = True
        elif job.state in states.ACTIVE:
            self.active[job.id] = job
            live = True
        if not live:
            self._left(job.id, job.changed_at)

    def _left(self, job_id: str, stamp: float) -> None:
        """`job_id` left QUEUED (or the copy) at `stamp`: while a full read is under way, none of its versions
        in that read as old as that may bring it back."""
        if self._reading is not None:
            self._gone[job_id] = max(self._gone.get(job_id, -math.inf), stamp)

    def _drop_reading(self) -> FullRead | None:
        reading, self._reading, self._gone = self._reading, None, {}
        if reading is not None:
            reading.cancel()
            self._dropped = [r for r in self._dropped if not r.done.is_set()] + [reading]
        return reading

    def _merge(self, reading: FullRead) -> set[str]:
        """Merge a finished background full read into the copy by `changed_at` (the module's docstring says
        why); the ids of the entries it replaced, added or dropped."""
        read = reading.jobs or {}
        copy = {**self.releasing, **self.active, **self.queued}
        touched: set[str] = set()
        dropped = 0
        for job_id in read.keys() | copy.keys():
            new, old = read.get(job_id), copy.get(job_id)
            if new is not None and old is not None:
                if new.changed_at > old.changed_at:
                    self._put(new)
                    touched.add(job_id)
            elif new is not None:
                if self._gone.get(job_id, -math.inf) < new.changed_at:
                    self._put(new)
                    touched.add(job_id)
            elif old is not None and old.changed_at < reading.visible:
                for held in (self.queued, self.as_queued, self.active, self.releasing):
                    held.pop(job_id, None)
                touched.add(job_id)
                dropped += 1
        log.info("job copy: full read of %d jobs off the passes in %.0f ms; merged %d, dropped %d",
                 len(read), reading.took * 1000, len(touched) - dropped, dropped)
        return touched


@dataclass(frozen=True)
class Snapshot:
    """What a pass decides on (JobMirror.snapshot): its own dicts, which later reads do not change."""
    queued: dict[str, JobRecord]
    as_queued: dict[str, Queued]
    active: dict[str, JobRecord]
    releasing: dict[str, JobRecord]

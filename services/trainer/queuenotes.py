"""Writes the waiting jobs' reasons and queue positions off the admission pass, coalesced.

A pass rewrites most of the queue's reasons (a reason names the use, which
every reservation changes), so with a long queue the writes cost more than the
decision: with 1,000 queued, one batch of 1,000 updates per pass. Holding the
pass (and every dispatch behind it) for them buys nothing: reservations are
what must be exact, reasons are what a user reads. So a pass hands its notes
here and moves on; one writer thread stores the newest note of each job (a
later pass's note replaces an unwritten earlier one), in batches, each update
filtered on the job still being QUEUED on that attempt (store.note_queued),
so a job dispatched or cancelled in between is left alone. Batches are at
least `INTERVAL` apart, so passes that follow each other closely (a storm)
share one write instead of each rewriting the queue: a note is stored within
about `INTERVAL` plus one batch write of the pass that made it. A long queue
spaces the batches further, `PER_NOTE` seconds per note of the last batch
(10,000 notes: 10 s), and at least `SHARE` times as long as the last batch
took to write, so rewriting positions that every dispatch shifts keeps the
store busy at most about 1/(1 + SHARE) of the time, whatever an update costs
on it; a note then waits at most that long.

Why the measured share: every dispatch shifts the position of every waiting
job, so with Q queued each batch is ~Q updates. On the embedded store (one
command at a time, an update ~2-10 ms on two loaded cores) a batch of 900
took seconds, so batches spaced by 1 ms per note kept the store writing notes
nearly all the time, and every submit and reservation queued behind them
(the 1,000-job burst: 34 submits/s, the pass's p99 0.7 s).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable

from trainforge_services.common.loop import Loop
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.store import JobStore

Note = tuple[str, int, str, int]  # (job, attempt, reason, position)
INTERVAL = 0.5
PER_NOTE = 0.001
SHARE = 4.0
# The writer runs when a pass hands it notes; this is only how often it looks without being woken.
IDLE = 60.0


def gap(written: int, took: float) -> float:
    """Seconds until the next batch after one of `written` notes that took `took` seconds to store."""
    return max(INTERVAL, written * PER_NOTE, SHARE * took)


class QueueNotes:
    def __init__(self, store: JobStore):
        self._store = store
        self._pending: dict[str, Note] = {}
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one batch write at a time keeps the newest note last
        self._loop = Loop("trainer-queue-notes", self._write_notes, interval=IDLE)
        # the reason and position each waiting job was last told by a pass (what its record says, once
        # stored); only the passes' thread uses it
        self._told: dict[str, tuple[str, int]] = {}

    def tell(self, told: Iterable[tuple[JobRecord, str, int]]) -> None:
        """A pass's (job, reason, position) of waiting jobs: each that differs from what the job was last told
        (not told yet: from what its record says) is stored. A reason names the use, so most do."""
        notes = []
        for job, reason, position in told:
            if self._told.get(job.id, (job.reason, job.queue_position)) != (reason, position):
                notes.append((job.id, job.attempt, reason, position))
                self._told[job.id] = (reason, position)
        self.add(notes)

    def read_again(self, job_ids: Iterable[str] | None) -> None:
        """These jobs were read again (None: every job was): what their records say is what they were told
        (a requeued job's new reason, say)."""
        if job_ids is None:
            self._told.clear()
        for job_id in job_ids or ():
            self._told.pop(job_id, None)

    def forget_gone(self, queued: Collection[str]) -> None:
        """Forget the jobs no longer in `queued` (once there are many of them)."""
        if len(self._told) > 2 * len(queued) + 1000:
            self._told = {j: n for j, n in self._told.items() if j in queued}

    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._loop.stop(timeout)
        self.flush()

    def add(self, notes: list[Note]) -> None:
        if not notes:
            return
        with self._lock:
            for note in notes:
                self._pending[note[0]] = note
        if not self._loop.started:
            self.flush()  # not started (a test driving passes by hand): store them now
        else:
            self._loop.wake()

    def flush(self) -> int:
        """Store the pending notes; how many."""
        with self._flushing:
            with self._lock:
                notes, self._pending = list(self._pending.values()), {}
            if notes:
                self._store.note_queued(notes)
            return len(notes)

    def _write_notes(self) -> None:
        """The loop's step: store what is pending, then let the store be for `gap` (notes handed over
        meanwhile wait for the next batch). A batch that failed is not tried again: the next pass's notes
        say the same or newer."""
        with self._lock:
            if not self._pending:  # nothing since the last batch (the loop's first run, an idle look)
                return
        started = time.monotonic()
        written = 0
        try:
            written = self.flush()
        finally:
            self._loop.stopping.wait(gap(written, time.monotonic() - started))

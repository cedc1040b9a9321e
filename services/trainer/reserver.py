"""The writer of the admission passes' reservations: their QUEUED -> DEPLOYING moves, in the order decided.

A pass decides on the job copy (services/trainer/jobmirror.py) and counts
each job it reserves as held from that moment (`JobMirror.reserve`); it
hands the moves here and goes on. One thread makes them, batch by batch in
the order the passes decided and job by job within a batch, so the store
sees what the passes counted, and each move's Deploy rule (services/trainer/
rules.py) hands the LCM call to the pool of LCM calls (services/trainer/lcmcalls.py) only once the move is
written. Each write's outcome goes back to the copy (`JobMirror.written`),
which counts the job as held until a read that began after it has been
applied (the copy's docstring says why). A write that failed may or may not
have been applied: the job stays counted until such a read says where it is.
A deposed leader's batch (services/trainer/fence.py) stops at its first
refused write; what is left of it is not written.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from trainforge_services.common.loop import Loop
from trainforge_services.common.states import JobState
from trainforge_services.trainer import cohorts
from trainforge_services.trainer.fence import Deposed
from trainforge_services.trainer.jobmirror import JobMirror
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.rules import ACTOR, Lifecycle

log = logging.getLogger(__name__)

# The writer runs when a pass hands it a batch; this is only how often it looks without being woken.
IDLE = 60.0


class Reservations:
    """One pass's reservations: (the job as the pass saw it, the fields to set) each, under the pass's term."""

    def __init__(self, term: int | None, decided: float):
        self.term = term
        self.decided = decided  # time.perf_counter() when the pass had decided
        self.moves: list[tuple[JobRecord, dict]] = []
        self.done = threading.Event()  # set once every move was written or given up


class ReservationWriter:
    def __init__(self, lifecycle: Lifecycle, jobs: JobMirror):
        self._lifecycle = lifecycle
        self._jobs = jobs
        self._queue: queue.Queue[Reservations] = queue.Queue()
        self._loop = Loop("trainer-reserve", self._write_handed, interval=IDLE)

    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout: float) -> None:
        """Write what was handed over, then end (call it after the last pass)."""
        if self._loop.stop(timeout):
            self._write_handed()  # what the loop had not taken yet: it has ended, so the order holds

    def hand(self, batch: Reservations) -> None:
        """Have `batch` written after every batch handed before it: by the loop once started, else now."""
        if self._loop.started and not self._loop.stopping.is_set():
            self._queue.put(batch)
            self._loop.wake()
        else:
            self.write(batch)

    def _write_handed(self) -> None:
        """Write every batch handed over, in the order handed (the loop's step)."""
        while True:
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                return
            self.write(batch)

    def write(self, batch: Reservations) -> None:
        try:
            started = time.perf_counter()
            moves, failed = batch.moves, 0
            for i, (job, fields) in enumerate(moves):
                try:
                    done = self._lifecycle.move(job.id, JobState.DEPLOYING, cohorts.reserved_reason(fields), ACTOR,
                                                attempt=job.attempt, fields=fields, fence=batch.term, seen=job)
                except Deposed as e:
                    log.warning("reservations stopped: %s; %d not written", e.message, len(moves) - i)
                    for left, _ in moves[i:]:
                        self._jobs.written(left.id, None, known=False)
                    failed += len(moves) - i
                    break
                except Exception as e:
                    log.warning("job %s: reserving it failed (%s); it counts as reserved until read again",
                                job.id, e)
                    self._jobs.written(job.id, None, known=False)
                    failed += 1
                    continue
                self._jobs.written(job.id, done.job)
            ended = time.perf_counter()
            # the line bench/burst.py reads (bench/_stack.py `reservation_writes`)
            log.info("admission writes: %d reservations written in %.1f ms, %.1f ms after their pass decided; "
                     "%d failed", len(moves) - failed, (ended - started) * 1000, (ended - batch.decided) * 1000,
                     failed)
        finally:
            batch.done.set()

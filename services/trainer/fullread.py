"""The periodic full read of the dispatcher's job copy (services/trainer/jobmirror.py), off the passes.

Reading every QUEUED and ACTIVE job at once is a pass's slowest part: with 1,000 queued it read 1,001 jobs
in 0.7-1.3 s, the slowest pass of a burst by far, when passes still read whole. So the copy reads
everything only now and then, on a thread of its own, in pages of `PAGE` jobs in `changed_at` order: the
store's index serves a page for about its own jobs' cost, and the store runs one command at a time, so a
read of what changed waits behind one page, not behind the whole set. After each page the read pauses
`PAGE_PAUSE` times as long as the page took. The copy merges a finished read by `changed_at`
(`JobMirror._merge`; that module's docstring says why the merge cannot over-admit).
"""

from __future__ import annotations

import math
import threading
import time

from trainforge_services.common import states
from trainforge_services.common.loop import Loop
from trainforge_services.common.states import JobState
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.store import JobStore

# jobs per page, and the pause after a page, as a multiple of how long it took
PAGE = 50
PAGE_PAUSE = 1.0
# the states the copy holds
LIVE = (JobState.QUEUED, *states.ACTIVE)
# the read's loop runs its step once and ends; this interval is never waited out
ONCE = 3600.0


class FullRead:
    """Every QUEUED and ACTIVE job and every pending cleanup, read in pages on a thread of its own."""

    def __init__(self, store: JobStore, fields: tuple[str, ...], started: float, visible: float,
                 page: int, pause: float):
        self._store, self._fields, self._page, self._pause = store, fields, page, pause
        self.started = started  # the copy's clock when it was started
        self.visible = visible  # every write stamped before this had committed when it started
        self.jobs: dict[str, JobRecord] | None = None  # once done: each job's newest version read (None: failed)
        self.error: Exception | None = None
        self.took = 0.0
        self.done = threading.Event()  # set when it ended: read, failed or cancelled
        self._cancelled = threading.Event()
        # a loop whose step runs once (the whole read): it gives the read its thread and a bounded join
        self._loop = Loop("trainer-jobcopy-read", self._run, interval=ONCE)

    def start(self) -> None:
        self._loop.start()

    def cancel(self) -> None:
        """Stop after the page being read; what was read is dropped (`jobs` stays None)."""
        self._cancelled.set()

    def join(self, timeout: float) -> None:
        """Cancel it and wait (at most `timeout` seconds) for its thread to end."""
        self._cancelled.set()
        self._loop.stop(timeout)

    def _run(self) -> None:
        began = time.monotonic()
        try:
            self.jobs = self._read()
        except Exception as e:  # the store is down or slow: the next pass starts another
            self.error = e
        finally:
            self.took = time.monotonic() - began
            self.done.set()
            self._loop.stopping.set()  # the loop ends after this one step

    def _read(self) -> dict[str, JobRecord] | None:
        found: dict[str, JobRecord] = {}

        def keep(jobs: list[JobRecord]) -> None:
            for job in jobs:
                if job.id not in found or found[job.id].changed_at < job.changed_at:
                    found[job.id] = job

        since = -math.inf
        while not self._cancelled.is_set():
            began = time.monotonic()
            page = self._store.live_page(LIVE, since, self._page, self._fields)
            keep(page)
            if len(page) < self._page:
                break
            if page[0].changed_at == page[-1].changed_at:
                # a page of one stamp (a new leader stamps every queued job at once): the rest from it, whole
                keep(self._store.live_page(LIVE, since, 0, self._fields))
                break
            # from the page's newest stamp again: a job changed since its page moved on to a later stamp,
            # which a later page reads
            since = page[-1].changed_at
            self._cancelled.wait(self._pause * (time.monotonic() - began))
        if self._cancelled.is_set():
            return None
        keep(self._store.pending_cleanups(fields=self._fields))
        return found

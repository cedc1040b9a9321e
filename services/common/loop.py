"""A service's background loop: one daemon thread that runs a step when woken, or when its interval has passed.

Every service keeps some work off its callers' threads: delivering webhooks, flushing notes, reading the queue,
running admission passes, supervising attempts. `Loop` is the one way they do it:

    loop = Loop("trainer-webhooks", self._deliver_due, interval=1.0)
    loop.start()      # the thread runs step() at once (at_once=False: after one interval), then on each
                      # wake() or after `interval` seconds
    loop.wake()       # run the step again soon (at most once for any number of wakes before it runs)
    loop.stop()       # no further step; waits (bounded) for the running one to return

A step that raises is logged and the loop goes on: a domain error (a store that is down) as a warning with its
message, anything else with its traceback. A step's own waits should use `loop.stopping` so that `stop()` is
prompt. Pacing: `spacing=(least, most)` spaces runs by twice the last step's duration within those bounds (an
expensive pass does not run back to back); `when` is asked before each run and the step is skipped while it says
no (a follower replica); the step's return value, if a number, is the most seconds until it should run again (a
retry due sooner than the interval). `wake_on` is an event that wakes the loop when set, for code wired before the
loop exists (a rule handed the event the loop is later built with).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from trainforge_services.common.errors import TrainforgeError

log = logging.getLogger(__name__)


class Loop:
    def __init__(self, name: str, step: Callable[[], float | None], *, interval: float,
                 spacing: tuple[float, float] | None = None, when: Callable[[], bool] | None = None,
                 stopping: threading.Event | None = None, wake_on: threading.Event | None = None):
        if interval <= 0:
            raise ValueError(f"loop {name}: interval must be > 0, got {interval}")
        if spacing is not None and not 0 <= spacing[0] <= spacing[1]:
            raise ValueError(f"loop {name}: spacing needs 0 <= least <= most, got {spacing}")
        self.name = name
        self._step = step
        self._interval = interval
        self._spacing = spacing
        self._when = when
        self.stopping = stopping if stopping is not None else threading.Event()
        self._wanted = wake_on if wake_on is not None else threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self, *, at_once: bool = True) -> None:
        """Start the thread; its first step runs at once, or with `at_once=False` after one interval (or a wake)."""
        if self._thread is not None:
            raise RuntimeError(f"loop {self.name} is already started")
        if at_once:
            self._wanted.set()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wanted.set()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop after the running step (if any); whether the thread ended within `timeout`."""
        self.stopping.set()
        self._wanted.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        if thread.is_alive():
            log.warning("loop %s did not stop within %.1fs", self.name, timeout)
            return False
        return True

    def _run(self) -> None:
        gap = self._spacing[0] if self._spacing else 0.0
        last = -gap
        wait = self._interval
        while not self.stopping.is_set():
            self._wanted.wait(wait)
            if gap:
                self.stopping.wait(max(0.0, last + gap - time.monotonic()))
            self._wanted.clear()
            if self.stopping.is_set():
                return
            wait = self._interval
            if self._when is not None and not self._when():
                continue
            last = time.monotonic()
            try:
                sooner = self._step()
            except TrainforgeError as e:
                log.warning("%s: %s", self.name, e.message)
            except Exception:
                log.exception("%s: the step failed unexpectedly", self.name)
            else:
                if isinstance(sooner, (int, float)) and not isinstance(sooner, bool):
                    wait = max(0.0, min(self._interval, float(sooner)))
            if self._spacing is not None:
                least, most = self._spacing
                gap = min(most, max(least, 2 * (time.monotonic() - last)))

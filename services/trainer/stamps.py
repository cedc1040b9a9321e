"""The `changed_at` stamps of this process's job writes that the store has not acknowledged yet.

A write takes its stamp before the store applies it, so a read of "every job
changed since T" can miss a write stamped before T that commits after the
read. The leader's job copy (jobmirror.py) used to cover that by reading
again from well before its last read (1 s, and 5 s every 2 s), which in a
burst meant reading the same few hundred new jobs on every pass.

Every stamping write of `JobStore` takes its stamp here (`STAMPS.taken()`)
and gives it back once the store answered (or failed). `settled()` is a time
before which every write of this process was acknowledged: the oldest stamp
still out, or now. A read that starts after `settled()` returned S sees every
write of this process stamped before S; the next read only has to go back to
S. That covers writes of this process only: the copy relies on it only where
this Trainer is the only writer of the jobs (no leader election: the only
replica).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator


class Stamps:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._out: dict[float, int] = {}  # stamp -> writes holding it

    @contextlib.contextmanager
    def taken(self) -> Iterator[float]:
        """A stamp (the clock's time) for one write, counted as out until the block is left."""
        with self._lock:
            now = self._clock()
            self._out[now] = self._out.get(now, 0) + 1
        try:
            yield now
        finally:
            with self._lock:
                if self._out[now] == 1:
                    del self._out[now]
                else:
                    self._out[now] -= 1

    def settled(self) -> float:
        """The oldest stamp still out, or now when none is."""
        with self._lock:
            now = self._clock()
            return min(min(self._out, default=now), now)


STAMPS = Stamps()

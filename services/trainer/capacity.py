"""The backend's capacity as the Trainer knows it: what the LCM last reported, asked at most once a second.

What a backend offers in total changes rarely, while asking costs a round
trip to an LCM that is busiest (starting processes) exactly when dispatch
passes come fastest; so a pass reuses an answer younger than `ttl`. Requests
(a submit's size check, the admin's cluster view) only read what is known and
never call the LCM. When the LCM cannot say, `problem` tells why, and the
queue waits with that reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from trainforge_services.common.errors import TrainforgeError
from trainforge_services.trainer.lcm_client import Lcm
from trainforge_services.trainer.resources import BackendSize

log = logging.getLogger(__name__)

# Longest a pass reuses the capacity the LCM last reported instead of asking again. An LCM refusal
# (full, down) is waited out by the deploy.
CAPACITY_TTL = 1.0


class CapacityCache:
    def __init__(self, lcm: Lcm, ttl: float = CAPACITY_TTL):
        self._lcm = lcm
        self._ttl = ttl
        self._value: BackendSize | None = None
        self._at = float("-inf")  # time.monotonic() of the last answer
        self.problem = "the LCM has not reported its capacity yet"
        self._asking = False  # a background refresh is in flight
        self._lock = threading.Lock()

    @property
    def value(self) -> BackendSize | None:
        """The capacity as last reported (None: not known yet); never calls the LCM."""
        return self._value

    def refresh(self) -> BackendSize | None:
        """Ask the LCM now; None when it cannot say (`problem` then says why)."""
        try:
            self._value = self._lcm.get_capacity()
            self._at = time.monotonic()
        except TrainforgeError as e:
            if e.message != self.problem:
                log.warning("LCM capacity unknown: %s", e.message)
            self.problem = e.message
            return None
        return self._value

    def current(self, background: Callable[[Callable[[], object]], None] | None = None) -> BackendSize | None:
        """For a pass: the last answer while it is younger than the TTL, else a new one.

        With `background` (runs a function off the pass's thread) an older answer is still returned and the
        new one asked for there, one at a time: the pass does not wait on a busy LCM for what changes rarely
        (the answer is then at most the TTL plus one round trip old). Only an unknown capacity is asked for
        in the pass.
        """
        if self._value is not None and time.monotonic() - self._at < self._ttl:
            return self._value
        if self._value is None or background is None:
            return self.refresh()
        with self._lock:
            if self._asking:
                return self._value
            self._asking = True
        background(self._refresh_then_done)
        return self._value

    def ask_if_stale(self, background: Callable[[Callable[[], object]], object]) -> None:
        """Unless the answer is known and younger than the TTL, or a refresh is in flight, ask the LCM again
        through `background` (which runs a function off the caller's thread; None: it did not)."""
        if self._value is not None and time.monotonic() - self._at < self._ttl:
            return
        with self._lock:
            if self._asking:
                return
            self._asking = True
        if background(self._refresh_then_done) is None:
            with self._lock:
                self._asking = False

    def _refresh_then_done(self) -> None:
        try:
            self.refresh()
        finally:
            with self._lock:
                self._asking = False

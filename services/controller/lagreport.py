"""The learner's log-shipping progress in etcd, for the LCM's `trainforge_log_shipping_lag_lines`.

The controller has no HTTP port, so every few seconds, while lines flow, it
puts `{attempt, archived, shipped}` at `jobs/<job>/logship/<rank>` under its
status lease: the key goes when the controller does. It sits outside
`learners/` so the job monitor's watch is not woken by it. A failed put is
logged once and tried again next time: the figure is for watching, never
worth stopping a learner for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from trainforge_services.common.adapters.etcd import Coordinator, Lease
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.loop import Loop

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 5.0


class LagReporter:
    def __init__(self, coordinator: Coordinator, key: str, attempt: int, lease: Callable[[], Lease | None],
                 counts: Callable[[], tuple[int, int]], interval: float = INTERVAL_SECONDS):
        self._coord, self._key, self._attempt = coordinator, key, attempt
        self._lease, self._counts = lease, counts
        self._loop = Loop("logship-lag", self.report, interval=interval)
        self._last: tuple[int, int] | None = None
        self._warned = False

    def start(self) -> LagReporter:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop(10)

    def report(self) -> bool:
        """Put the counts when they changed and a lease is held; True when put."""
        counts, lease = self._counts(), self._lease()
        if counts == self._last or lease is None:
            return False
        archived, shipped = counts
        try:
            self._coord.put(self._key, {"attempt": self._attempt, "archived": archived, "shipped": shipped},
                            lease=lease)
        except TrainforgeError as e:
            if not self._warned:
                log.warning("cannot report log-shipping progress: %s", e.message)
                self._warned = True
            return False
        self._last = counts
        return True

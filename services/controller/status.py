"""The learner's status in etcd, kept alive by a lease, written from one background loop.

The status key is how the job monitor knows a learner lives: it is held by
a lease the controller refreshes every TTL/3, so a controller that vanishes
takes its key with it. All etcd traffic runs on one background loop, so
etcd being slow or briefly down never holds up the learner; the loop keeps
the latest wanted document and retries until it is written. A lease that
expired during an outage is replaced and the document rewritten.

Only that loop writes the key, in order. The final document is written
without a lease (so the monitor still reads it after the controller exits),
and only then is the lease revoked. Documents are `LearnerStatus` models
(services/common/contracts/etcd.py); what is stored is their `.value()`.
"""

from __future__ import annotations

import logging
import threading
import time

from trainforge_services.common.adapters.etcd import Coordinator, Lease
from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.loop import Loop
from trainforge_services.common.retry import QUICK, Policy

log = logging.getLogger(__name__)


class StatusPublisher:
    def __init__(self, coordinator: Coordinator, key: str, ttl: int, *, retry: Policy = QUICK):
        self._coord, self._key, self._ttl = coordinator, key, ttl
        # Waits are the loop's, never a sleep: a new status or the final one cuts a wait short.
        self._backoff = retry.backoff()
        self._lock = threading.Lock()
        self._wanted: LearnerStatus | None = None
        self._version = 0
        self._written_version = 0
        self._next_refresh = 0.0
        self._warned = False
        self._final: LearnerStatus | None = None
        self._final_written = threading.Event()
        self._ended = threading.Event()
        self._give_up_at = float("inf")
        # each step says when it is due again (a refresh or a retry): the interval only bounds that
        self._loop = Loop("status-publisher", self._step, interval=max(float(ttl), retry.maximum))
        self.lease: Lease | None = None

    def start(self) -> StatusPublisher:
        self._loop.start()
        return self

    def publish(self, doc: LearnerStatus) -> None:
        """Make `doc` the learner's status (under the lease); returns at once."""
        with self._lock:
            self._wanted = doc
            self._version += 1
        self._loop.wake()

    def finish(self, doc: LearnerStatus, timeout: float) -> bool:
        """Write the final `doc` without a lease, then revoke the lease; True when written."""
        with self._lock:
            self._final = doc
            self._give_up_at = time.monotonic() + timeout
        self._loop.wake()
        self._ended.wait(timeout + 1.0)
        return self._final_written.is_set()

    # -- the publishing loop ----------------------------------------------------

    def _step(self) -> float | None:
        with self._lock:
            final, wanted, version = self._final, self._wanted, self._version
        try:
            if final is not None:
                self._write_final(final)
                self._end()
                return None
            if self.lease is None:
                self.lease = self._coord.grant_lease(self._ttl)
                self._written_version = 0
                self._next_refresh = time.monotonic() + self._ttl / 3
                log.info("status lease %x granted (ttl %ds)", self.lease.id, self._ttl)
            if wanted is not None and version != self._written_version:
                self._coord.put(self._key, wanted.value(), lease=self.lease)
                self._written_version = version
            if time.monotonic() >= self._next_refresh:
                if not self.lease.refresh():
                    log.warning("status lease %x expired; granting a new one and rewriting the status",
                                self.lease.id)
                    self.lease = None
                    return 0.0
                self._next_refresh = time.monotonic() + self._ttl / 3
            if self._warned:
                log.info("etcd reachable again")
            self._warned = False
            self._backoff.reset()
            return max(0.0, self._next_refresh - time.monotonic())
        except Exception as e:  # noqa: BLE001 - etcd trouble of any kind: retry, never die
            if final is not None and time.monotonic() >= self._give_up_at:
                log.error("could not write the final status to etcd: %s", e)
                self._end()
                return None
            if not self._warned:
                log.warning("etcd unavailable, retrying: %s", e)
                self._warned = True
            return self._backoff.next()

    def _end(self) -> None:
        self._loop.stop()
        self._ended.set()

    def _write_final(self, doc: LearnerStatus) -> None:
        self._coord.put(self._key, doc.value())
        self._final_written.set()
        if self.lease is not None:
            self.lease.revoke()
            self.lease = None

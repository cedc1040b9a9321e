"""The learner's status in etcd, kept alive by a lease, written from one thread.

The status key is how the job monitor knows a learner lives: it is held by
a lease the controller refreshes every TTL/3, so a controller that vanishes
takes its key with it. All etcd traffic runs on one background thread, so
etcd being slow or briefly down never holds up the learner; the thread keeps
the latest wanted document and retries until it is written. A lease that
expired during an outage is replaced and the document rewritten.

Only that thread writes the key, in order. The final document is written
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
from trainforge_services.common.retry import Backoff

log = logging.getLogger(__name__)


class StatusPublisher:
    def __init__(self, coordinator: Coordinator, key: str, ttl: int, *, retry_max: float = 2.0):
        self._coord, self._key, self._ttl = coordinator, key, ttl
        # Waits are on the wake event, never a sleep: a new status or the final one cuts a wait short.
        self._backoff = Backoff(min(0.1, retry_max), retry_max)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._wanted: LearnerStatus | None = None
        self._version = 0
        self._final: LearnerStatus | None = None
        self._final_written = threading.Event()
        self._give_up_at = float("inf")
        self._thread = threading.Thread(target=self._run, name="status-publisher", daemon=True)
        self.lease: Lease | None = None

    def start(self) -> StatusPublisher:
        self._thread.start()
        return self

    def publish(self, doc: LearnerStatus) -> None:
        """Make `doc` the learner's status (under the lease); returns at once."""
        with self._lock:
            self._wanted = doc
            self._version += 1
        self._wake.set()

    def finish(self, doc: LearnerStatus, timeout: float) -> bool:
        """Write the final `doc` without a lease, then revoke the lease; True when written."""
        with self._lock:
            self._final = doc
            self._give_up_at = time.monotonic() + timeout
        self._wake.set()
        self._thread.join(timeout + 1.0)
        return self._final_written.is_set()

    # -- the publishing thread --------------------------------------------------

    def _run(self) -> None:
        written_version = 0
        next_refresh = 0.0
        warned = False
        while True:
            self._wake.clear()
            with self._lock:
                final, wanted, version = self._final, self._wanted, self._version
            try:
                if final is not None:
                    self._write_final(final)
                    return
                if self.lease is None:
                    self.lease = self._coord.grant_lease(self._ttl)
                    written_version = 0
                    next_refresh = time.monotonic() + self._ttl / 3
                    log.info("status lease %x granted (ttl %ds)", self.lease.id, self._ttl)
                if wanted is not None and version != written_version:
                    self._coord.put(self._key, wanted.value(), lease=self.lease)
                    written_version = version
                if time.monotonic() >= next_refresh:
                    if not self.lease.refresh():
                        log.warning("status lease %x expired; granting a new one and rewriting the status",
                                    self.lease.id)
                        self.lease = None
                        continue
                    next_refresh = time.monotonic() + self._ttl / 3
                if warned:
                    log.info("etcd reachable again")
                warned = False
                self._backoff.reset()
                self._wake.wait(max(0.0, next_refresh - time.monotonic()))
            except Exception as e:  # noqa: BLE001 - etcd trouble of any kind: retry, never die
                if final is not None and time.monotonic() >= self._give_up_at:
                    log.error("could not write the final status to etcd: %s", e)
                    return
                if not warned:
                    log.warning("etcd unavailable, retrying: %s", e)
                    warned = True
                self._wake.wait(self._backoff.next())

    def _write_final(self, doc: LearnerStatus) -> None:
        self._coord.put(self._key, doc.value())
        self._final_written.set()
        if self.lease is not None:
            self.lease.revoke()
            self.lease = None

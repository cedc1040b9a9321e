"""The job monitor's claim on its job: one monitor at a time, under a lease.

The `monitor` key holds a `MonitorClaim` (pid, host, attempt) created only
if absent and kept alive by a lease, so a monitor that dies lets the job go
when its lease runs out. A monitor of an earlier attempt (or one known dead
on this machine, or an unreadable claim) is waited out rather than obeyed;
a live one of this or a later attempt makes the newcomer step aside.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from trainforge_services.common.adapters.etcd import Coordinator, Lease
from trainforge_services.common.contracts.etcd import MonitorClaim
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.loop import Loop
from trainforge_services.common.retry import Policy

log = logging.getLogger(__name__)


class JobClaim:
    """The `monitor` key of one job attempt: `acquire()`, `keep()` (a loop), `release()`."""

    def __init__(self, coordinator: Coordinator, job_id: str, attempt: int, *, lease_ttl: int, retry: Policy,
                 stop: threading.Event, clock: Callable[[], float]):
        self._coord, self.job_id, self.attempt = coordinator, job_id, attempt
        self._key = coordinator.keys.monitor(job_id)
        self._lease_ttl, self._retry, self._stop, self._clock = lease_ttl, retry, stop, clock
        self._lease: Lease | None = None
        self._lease_lock = threading.Lock()
        self.lost = threading.Event()  # another monitor holds the job now
        self._keeper = Loop("monitor-lease", self._refresh, interval=max(lease_ttl / 3, 0.2))

    def record(self) -> MonitorClaim:
        return MonitorClaim(pid=os.getpid(), host=socket.gethostname(), attempt=self.attempt)

    def _try_claim(self) -> bool:
        lease = self._coord.grant_lease(self._lease_ttl)
        if self._coord.create(self._key, self.record().value(), lease=lease):
            with self._lease_lock:
                self._lease = lease
            return True
        lease.revoke()
        return False

    def acquire(self) -> bool:
        """Hold the job's monitor key; False when a live monitor of this (or a later) attempt has it.

        A monitor of an earlier attempt, one that was killed on this machine,
        or an unreadable claim leaves its key until its lease runs out; that
        one is waited for (up to three lease TTLs) rather than obeyed.
        """
        key = self._key
        deadline = self._clock() + 3 * self._lease_ttl
        backoff = self._retry.backoff()
        warned = False
        while not self._stop.is_set():
            try:
                if self._try_claim():
                    return True
                value, _ = self._coord.get(key)
            except Unavailable as e:
                log.warning("job %s: cannot claim the job yet: %s", self.job_id, e.message)
                self._stop.wait(backoff.next())
                continue
            if value is None:
                continue
            holder = MonitorClaim.parse_or_none(value)
            if holder is None and not warned:
                log.warning("job %s: skipping the unreadable claim at %s (%s); waiting for its lease to end",
                            self.job_id, key, value)
                warned = True
            # Obeyed: a live monitor of this or a later attempt. Anything else lives only as long as its
            # lease, so it is waited out, up to the deadline.
            obeyed = holder is not None and holder.attempt >= self.attempt and not self._dead_here(holder)
            if obeyed or self._clock() > deadline:
                log.info("job %s: monitor already running (%s); exiting", self.job_id, value)
                return False
            self._stop.wait(min(1.0, self._lease_ttl / 3))
        return False

    @staticmethod
    def _dead_here(holder: MonitorClaim) -> bool:
        """Whether the claim's holder was a process on this machine that no longer exists."""
        if holder.host != socket.gethostname() or holder.pid <= 0:
            return False
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def keep(self) -> None:
        """Refresh the lease every TTL/3 until `release()`; a lost claim sets `lost`."""
        self._keeper.start()

    def _refresh(self) -> None:
        with self._lease_lock:
            lease = self._lease
        if lease is None or self._stop.is_set():
            return
        try:
            alive = lease.refresh()
        except Unavailable as e:
            log.debug("job %s: lease refresh failed: %s", self.job_id, e.message)
            return
        if alive:
            return
        log.warning("job %s: the monitor's lease expired; claiming the job again", self.job_id)
        try:
            if not self._try_claim():
                self.lost.set()
                self._keeper.stop()
        except Unavailable as e:
            log.debug("job %s: re-claim failed: %s", self.job_id, e.message)

    def release(self) -> None:
        self._keeper.stop(5)
        with self._lease_lock:
            lease, self._lease = self._lease, None
        if lease is not None:
            lease.revoke()

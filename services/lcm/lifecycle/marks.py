"""The `killed` marks: the highest attempt of each job removed, kept in etcd so a late deploy of it starts nothing.

The removal of an attempt outlives its record: in the same etcd transaction
that deletes the job's prefix, the job's `<prefix>/lcm/killed/<job>` key
(`AttemptKilled`) records the highest attempt removed (or named by the
KillJob: marked even before that attempt's deploy arrived), under a lease of
`killed_ttl` seconds (TF_KILLED_TTL, an hour by default: longer than any
dispatcher retries a lost deploy). A deploy of that attempt or an older one,
resent or arriving late (e.g. through a leader change after the KillJob), is a Conflict
and starts nothing; a later attempt deploys. Being in etcd, the key is seen
by every replica and survives an LCM restart, and, written through the
fenced coordinator, never by a deposed leader.
"""

from __future__ import annotations

import threading
import time

from trainforge_services.common.adapters.etcd import Coordinator, Lease
from trainforge_services.common.contracts.etcd import AttemptInfo, AttemptKilled
from trainforge_services.common.errors import Unavailable


class KilledMarks:
    """Each job's `killed` mark, and the clearing of its etcd keys that writes it."""

    def __init__(self, coordinator: Coordinator, ttl: int):
        self._coord = coordinator
        self._keys = coordinator.keys
        self._ttl = ttl
        self._lease: tuple[Lease, float] | None = None  # shared by the marks of a tenth of the TTL
        self._lease_lock = threading.Lock()

    def highest(self, job_id: str) -> int:
        """The highest attempt of the job removed within the TTL (0: none)."""
        marker = AttemptKilled.parse_or_none(self._coord.get(self._keys.killed(job_id))[0])
        return marker.attempt if marker else 0

    def clear(self, job_id: str, named: int = 0, *, mark: bool = True) -> None:
        """Delete the job's etcd keys and, in the same transaction, mark killed the higher of `named` and the
        attempt the job's `attempt` key names, if that is above the job's mark (the mark never goes down).
        `mark=False`: only delete (a launch cut short, cleared to be redone as the same attempt)."""
        attempt = 0
        if mark:
            info = AttemptInfo.parse_or_none(self._coord.get(self._keys.attempt(job_id))[0])
            attempt = max(named, info.attempt if info else 0)
        if attempt > self.highest(job_id):
            marker = AttemptKilled(attempt=attempt)
            try:
                self._coord.delete_prefix(self._keys.job(job_id), put=(self._keys.killed(job_id), marker.value()),
                                          lease=self._lease_for_marks())
            except Unavailable:
                self._lease = None  # e.g. the lease is gone: the retried KillJob takes a new one
                raise
        else:
            self._coord.delete_prefix(self._keys.job(job_id))

    def _lease_for_marks(self) -> Lease:
        """One lease per tenth of the TTL, not one per kill, so etcd holds about ten such leases however many
        jobs end; a mark lives 0.9 to 1 times the TTL."""
        with self._lease_lock:
            now = time.monotonic()
            if self._lease is None or now - self._lease[1] > self._ttl / 10:
                self._lease = (self._coord.grant_lease(self._ttl), now)
            return self._lease[0]

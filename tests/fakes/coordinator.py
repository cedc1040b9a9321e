"""A dict in place of etcd: just the Coordinator calls the LCM's lifecycle makes (no watches; a lease is only
remembered by its TTL, nothing expires)."""

from __future__ import annotations

import copy
import itertools
import threading
from dataclasses import dataclass

from trainforge_services.common.keys import Keys


@dataclass(frozen=True)
class MemoryLease:
    id: int
    ttl: int


class MemoryCoordinator:
    def __init__(self, prefix: str = "/trainforge"):
        self.keys = Keys(prefix)
        self.data: dict[str, dict] = {}
        self.leases: dict[str, MemoryLease] = {}  # the lease each key was last written under
        self._lock = threading.Lock()
        self._lease_ids = itertools.count(1)

    def grant_lease(self, ttl: int) -> MemoryLease:
        return MemoryLease(next(self._lease_ids), ttl)

    def put(self, key: str, value: dict, lease: object = None) -> None:
        with self._lock:
            self.data[key] = copy.deepcopy(value)

    def get(self, key: str) -> tuple[dict | None, int]:
        with self._lock:
            value = self.data.get(key)
        return (copy.deepcopy(value), 1) if value is not None else (None, 0)

    def list(self, prefix: str) -> tuple[dict[str, dict], int]:
        with self._lock:
            return {k: copy.deepcopy(v) for k, v in self.data.items() if k.startswith(prefix)}, 1

    def create(self, key: str, value: dict, lease: object = None) -> bool:
        with self._lock:
            if key in self.data:
                return False
            self.data[key] = copy.deepcopy(value)
            return True

    def delete(self, key: str) -> None:
        with self._lock:
            self.data.pop(key, None)

    def delete_prefix(self, prefix: str, *, put: tuple[str, dict] | None = None,
                      lease: MemoryLease | None = None) -> None:
        with self._lock:
            for key in [k for k in self.data if k.startswith(prefix)]:
                del self.data[key]
                self.leases.pop(key, None)
            if put is not None:
                self.data[put[0]] = copy.deepcopy(put[1])
                if lease is not None:
                    self.leases[put[0]] = lease

    def confirm(self) -> None:
        """Unfenced, as a plain `Coordinator`."""

    def close(self) -> None:
        pass

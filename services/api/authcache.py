"""A short-lived cache of who a credential belongs to, so a GET does not read the store every time.

Every request is still authenticated: a hit is the answer of a full check
(hash compared, key not revoked, not expired, team enabled) made at most
`ttl` seconds ago (≤ 1 s, the staleness bound promised for revocation and a
team's disabling). A key's expiry is compared with the clock on every hit,
so an expired key is refused at its expiry, cache or not. Entries are keyed
by the SHA-256 of the whole presented key (a hit therefore implies the same
secret was presented), or by the key id for tokens, whose signature and
claims are verified on every request before the cache is asked. Failures are
never cached: a refused credential goes back to the store each time.

Revoking a key or disabling a team through this API process drops the
matching entries at once; another replica sees it within `ttl`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainforge_services.common.errors import InvalidArgument

if TYPE_CHECKING:
    from trainforge_services.api.identity import Tenant

MAX_TTL = 1.0
# Bound on entries: a cache full of distinct keys is simply emptied (the next requests go to the store).
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class _Entry:
    tenant: Tenant
    checked_at: float  # time.monotonic() of the full check
    expires_at: float | None  # the key's expiry, unix seconds


class AuthCache:
    def __init__(self, ttl: float):
        if not 0 <= ttl <= MAX_TTL:
            raise InvalidArgument(f"auth cache ttl {ttl} must be between 0 and {MAX_TTL} seconds",
                                  details=[{"field": "auth_cache_seconds", "message": f"0 to {MAX_TTL}"}])
        self.ttl = ttl
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def get(self, token: str) -> Tenant | None:
        """The tenant of a credential checked less than `ttl` ago whose key has not expired since; else None."""
        if self.ttl <= 0:
            return None
        entry = self._entries.get(token)
        if entry is None:
            return None
        if time.monotonic() - entry.checked_at >= self.ttl or (
                entry.expires_at is not None and entry.expires_at <= time.time()):
            with self._lock:
                if self._entries.get(token) is entry:
                    del self._entries[token]
            return None
        return entry.tenant

    def put(self, token: str, tenant: Tenant, expires_at: float | None, checked_at: float) -> None:
        """Remember a full check made at `checked_at` (monotonic, taken *before* the store was read)."""
        if self.ttl <= 0:
            return
        with self._lock:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[token] = _Entry(tenant, checked_at, expires_at)

    def drop(self, *, key_id: str | None = None, team: str | None = None) -> None:
        """Forget every entry of a key or of a team (revoked, disabled) in this process."""
        with self._lock:
            for token, entry in list(self._entries.items()):
                if entry.tenant.key_id == key_id or entry.tenant.team == team:
                    del self._entries[token]

"""Per-key request limits: a token bucket per API key, in this process.

Each key may make `burst` requests at once and `rate` per second after
that; a request over the limit is answered 429 with `Retry-After` (whole
seconds until a token is back). A key's API key and the tokens exchanged
for it share one bucket, keyed by the key id. Buckets are counted after
authentication, so nobody can spend another key's allowance by sending its
(public) id with a wrong secret. These buckets are per process; API
replicas share one limit through services/api/ratelimit_shared.py
(`TF_RATE_LIMIT_SHARED=1`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from trainforge_services.common.errors import ResourceExhausted


class RateLimited(ResourceExhausted):
    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


class RateLimiter:
    """`check(key)` spends one token of key's bucket or raises RateLimited. rate 0 turns it off."""

    blocking = False  # whether `check` does I/O (then the API calls it from its thread pool)

    def __init__(self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 100_000):
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def check(self, key: str) -> None:
        if self.rate <= 0:
            return
        wait = self._take(key)
        if wait > 0:
            raise RateLimited(f"too many requests for API key {key}: the limit is {self.rate:g}/s "
                              f"with bursts of {self.burst}; retry in {wait:.1f}s", wait)

    def _take(self, key: str) -> float:
        """0 when a token was spent, else seconds until one is available."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, now)
                if len(self._buckets) > self._max_keys:
                    self._forget_full(now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1 - tokens) / self.rate

    def _forget_full(self, now: float) -> None:
        """Drop buckets that have refilled: forgetting them changes nothing."""
        for key, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * self.rate >= self.burst:
                del self._buckets[key]

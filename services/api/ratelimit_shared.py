"""Per-key request limits shared by every API replica, kept in MongoDB.

With `TF_RATE_LIMIT_SHARED=1` (set by `trainforge up --replicas N` and by
the chart when the API runs more than one replica) a key's allowance is one
across replicas rather than one per replica. The same limit as the
in-process bucket (services/api/ratelimit.py: `burst` at once, `rate` per
second after), written as GCRA: one document per key holds its
*theoretical arrival time* `tat`, and a request is let through when
`max(tat, now) + 1/rate` is at most `burst/rate` ahead of now. That new
`tat` is written by compare-and-set on the value just read, so replicas
racing for a key's last token cannot both get it; a lost race reads again.
Times are the replicas' wall clocks (their skew adds to or takes from a
key's burst by skew x rate requests). A refused request writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trainforge_services.api.ratelimit import RateLimiter
from trainforge_services.common.adapters.mongo import Database, DuplicateKeyError, mapped_as

mapped = mapped_as("rate limit store")

COLLECTION = "rate_limits"
# More lost races than this for one request: let it through rather than loop (the limit is approximate
# under such contention anyway).
_MAX_RACES = 8


class SharedRateLimiter(RateLimiter):
    """`RateLimiter` whose buckets live in MongoDB (one document per key)."""

    blocking = True

    def __init__(self, db: Database, rate: float, burst: int, *, collection: str = COLLECTION,
                 clock: Callable[[], float] = time.time):
        super().__init__(rate, burst, clock=clock)
        self._limits = db[collection]

    @mapped
    def _take(self, key: str) -> float:
        emission, horizon = 1.0 / self.rate, self.burst / self.rate
        for _ in range(_MAX_RACES):
            now = self._clock()
            doc = self._limits.find_one({"_id": key})
            tat = max(float(doc["tat"]), now) if doc else now
            ahead = tat + emission - now
            if ahead > horizon:
                return ahead - horizon
            if doc is None:
                try:
                    self._limits.insert_one({"_id": key, "tat": tat + emission})
                    return 0.0
                except DuplicateKeyError:
                    continue  # another replica's first request for this key
            if self._limits.update_one({"_id": key, "tat": doc["tat"]},
                                       {"$set": {"tat": tat + emission}}).modified_count:
                return 0.0
        return 0.0

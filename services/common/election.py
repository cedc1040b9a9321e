"""Leader election among a service's replicas, through one etcd key under a lease.

Every replica campaigns for `<prefix>/leaders/<service>` (services/common/
keys.py): the key is created only if absent, under a lease of `ttl`
seconds that the winner keeps alive. The winner's *term* is the key's
create revision, which etcd makes larger at every election, so a term
orders leaders: a store that remembers the newest term it was shown can
refuse a write carrying an older one (the Trainer's fence, services/
trainer/fence.py).

A leader whose lease expired, or which could not refresh it for one whole
TTL (etcd unreachable: a follower may already have taken over), considers
itself deposed and campaigns again. A leader that dies lets its key go when
its lease runs out, and a follower, polling every `ttl / 4` seconds, takes
over within about one TTL. The callbacks run on one worker thread, in
order, so a slow takeover (reconciling the store) never delays a lease
refresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from trainforge_services.common.adapters.etcd import Coordinator, Lease
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.loop import Loop

log = logging.getLogger(__name__)

# In the UNAVAILABLE answer of a follower to a call only the leader serves: a client that lists the
# replicas asks the next one at once (services/trainer/lcm_client.py).
FOLLOWING = "replica is following"


class Election:
    """`start()` campaigns on a background loop; `term` is the current term while leading, else None."""

    def __init__(self, coordinator: Coordinator, service: str, *, ttl: int, identity: str,
                 on_elected: Callable[[int], None], on_deposed: Callable[[], None]):
        if ttl < 2:
            raise ValueError(f"leader lease ttl must be at least 2 seconds, not {ttl}")
        self._coord, self.service, self._ttl, self.identity = coordinator, service, ttl, identity
        self.key = coordinator.keys.leader(service)
        self._on_elected, self._on_deposed = on_elected, on_deposed
        self._lease: Lease | None = None
        self._refreshed = 0.0
        self.term: int | None = None
        self._resign = threading.Event()
        # a leader refreshes every ttl / 3 (the interval), a follower polls every ttl / 4 (the step says so)
        self._loop = Loop(f"{service}-election", self._step, interval=ttl / 3)
        self._callbacks = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{service}-leadership")

    @property
    def leading(self) -> bool:
        return self.term is not None

    def start(self) -> Election:
        self._loop.start()
        return self

    def stop(self, resign: bool = True) -> None:
        """Stop campaigning; `resign` revokes the lease so a follower takes over at once."""
        self._loop.stop(timeout=10)
        if self.term is not None:
            self._depose("stopping")
        if resign and self._lease is not None:
            self._lease.revoke()
        self._lease = None
        self._callbacks.shutdown(wait=True)

    def resign(self) -> None:
        """Give up leading (e.g. a takeover that could not finish) and campaign again."""
        self._resign.set()

    def _step(self) -> float:
        if self._resign.is_set():
            self._resign.clear()
            lease, self._lease = self._lease, None
            if lease is not None:
                lease.revoke()
            self._depose("resigned")
        try:
            if self._lease is None:
                self._campaign()
            else:
                self._keep()
        except Unavailable as e:
            log.debug("%s election: %s", self.service, e.message)
            if self._lease is not None and time.monotonic() - self._refreshed > self._ttl:
                self._lease = None
                self._depose(f"no lease refresh for {self._ttl}s ({e.message})")
        return self._ttl / 3 if self._lease is not None else self._ttl / 4

    def _campaign(self) -> None:
        if self._coord.get(self.key)[0] is not None:
            return  # a leader holds it: no lease is granted (and revoked) every poll
        lease = self._coord.grant_lease(self._ttl)
        try:
            created = self._coord.create(self.key, {"holder": self.identity}, lease=lease)
            value, revision = self._coord.get(self.key) if created else (None, 0)
        except Unavailable:
            lease.revoke()
            raise
        if not created or (value or {}).get("holder") != self.identity:
            lease.revoke()
            return
        self._lease, self._refreshed = lease, time.monotonic()
        # the revision of a key just created is its create revision: larger at every election
        self.term = revision
        log.info("%s: %s elected leader (term %d)", self.service, self.identity, revision)
        self._callbacks.submit(_logged, self._on_elected, revision)

    def _keep(self) -> None:
        lease = self._lease
        if lease is None:
            return
        if lease.refresh():
            self._refreshed = time.monotonic()
            return
        self._lease = None
        self._depose("the leader's lease expired")

    def _depose(self, why: str) -> None:
        if self.term is None:
            return
        log.warning("%s: %s is no longer the leader (term %d): %s", self.service, self.identity, self.term, why)
        self.term = None
        self._callbacks.submit(_logged, self._on_deposed)


def _logged(fn: Callable[..., None], *args: object) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("%s leadership callback failed", getattr(fn, "__name__", fn))

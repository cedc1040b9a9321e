"""The dispatcher's fence: the store refuses reservations from a leader that was deposed.

Trainer replicas elect one dispatcher (services/common/election.py), but an
election alone cannot stop a leader that was paused (GC, a stalled host, a
partition from etcd) from waking up and running one more admission pass
while a newer leader runs its own: two passes spending the same free
capacity would overshoot a quota. So every reservation carries the leader's
term, and MongoDB, not etcd, decides:

1. `Fence.take(term)` on election raises the `fences` document's term by
   compare-and-set (only upwards; a newer leader's term is never lowered);
   then `JobStore.stamp_fence(term)` stamps every QUEUED job, and every
   ACTIVE elastic job, with it.
2. A pass reads the queue, then `FenceGate.confirm()` checks that the
   `fences` term is still its own (else the pass stops: `Deposed`).
3. Each QUEUED -> DEPLOYING (or -> FAILED) of the pass is a compare-and-set
   that also requires the job's stamp to be no newer than the pass's term
   (`JobStore.apply_transition(fence=...)`), and stamps it. So is each grant
   to an elastic job (`JobStore.grant(fence=...)`).

Why that is enough: every job a pass read was inserted before its step 2.
If the new leader took the fence before that step, the pass stops there;
if after, the new leader's stamp (step 1) reaches every one of those jobs
still QUEUED, so the old pass's later reservations all fail, and those it
made before the stamp are committed before the new leader's first pass
reads what ACTIVE jobs hold. Either way no two passes reserve from the same
capacity. The same holds for grants: a job a pass grants to was RUNNING
when the pass read it, before its step 2, so the new leader's stamp reaches
it if the pass got past that step.
"""

from __future__ import annotations

import logging
import threading
import time

from trainforge_services.common.adapters.mongo import Database, DuplicateKeyError, ReturnDocument, mapped_as
from trainforge_services.common.errors import Conflict

log = logging.getLogger(__name__)
mapped = mapped_as("fence store")

COLLECTION = "fences"


class Deposed(Conflict):
    """A write made under a term older than the store's: its writer is no longer the leader."""


class Fence:
    """The newest term the store has seen for one singleton (`name`), in the `fences` collection."""

    def __init__(self, db: Database, name: str, collection: str = COLLECTION):
        self._fences, self.name = db[collection], name

    @mapped
    def take(self, term: int, holder: str) -> bool:
        """Make `term` the current one; False when the store already knows this or a newer term."""
        try:
            doc = self._fences.find_one_and_update(
                {"_id": self.name, "term": {"$lt": term}},
                {"$set": {"term": term, "holder": holder, "since": time.time()}},
                upsert=True, return_document=ReturnDocument.AFTER)
        except DuplicateKeyError:  # a document with this or a newer term exists: the upsert's insert collided
            return False
        return doc is not None and doc.get("term") == term

    @mapped
    def current(self) -> int:
        """The newest term taken (0: none yet)."""
        doc = self._fences.find_one({"_id": self.name})
        return int(doc["term"]) if doc else 0


class FenceGate:
    """What the dispatcher asks before each pass: whether it leads, and under which term.

    A gate that was never opened (`lead`) leads nothing; the Trainer wiring
    gives the dispatcher no gate at all when it runs as the only replica.
    """

    def __init__(self, fence: Fence):
        self._fence = fence
        self._term: int | None = None
        self._lock = threading.Lock()

    @property
    def leading(self) -> bool:
        return self._term is not None

    @property
    def term(self) -> int | None:
        """The term this replica leads under (None: it follows)."""
        return self._term

    def lead(self, term: int) -> None:
        with self._lock:
            self._term = term

    def follow(self) -> None:
        with self._lock:
            self._term = None

    def confirm(self) -> int:
        """This replica's term if the store still knows it as the newest; else `Deposed` (and follow)."""
        term = self._term
        if term is None:
            raise Deposed("this replica is not the dispatcher's leader")
        current = self._fence.current()
        if current != term:
            with self._lock:
                if self._term == term:
                    self._term = None
            raise Deposed(f"the dispatcher's term {term} was superseded by term {current}")
        return term

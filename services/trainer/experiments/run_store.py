"""A run of many jobs in MongoDB: what an experiment's and a workflow's documents share.

A run document is one team's, named, in a state (`ExperimentState`, which
workflows share) with the reason it is in it, and `settled` once the driver
has nothing left to do while it stays there. Its id is chosen by whoever
submits it; a taken id is a Conflict. Every state change is a compare-and-set
on the states it may leave, and every other change a `$set` of named fields.
`RunStore` holds those parts; store.py (experiments: planned trials) and
workflow_store.py (workflows: a DAG of experiments) add what each document
holds of its own.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from trainforge_services.common.adapters.mongo import (
    DESCENDING,
    Database,
    DuplicateKeyError,
    ReturnDocument,
    mapped_errors,
)
from trainforge_services.common.contracts.experiments import ExperimentState
from trainforge_services.common.errors import Conflict, NotFound

_NEWEST_FIRST = [("created_at", DESCENDING), ("_id", DESCENDING)]


class RunRecord(BaseModel):
    """The fields every run document has."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    id: str
    team: str = ""
    name: str = ""
    state: ExperimentState = ExperimentState.EXPERIMENT_STATE_UNSPECIFIED
    reason: str = ""
    code_uri: str = ""
    submitted_by: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0


R = TypeVar("R", bound=RunRecord)
F = TypeVar("F", bound=Callable[..., Any])


def mapped(fn: F) -> F:
    """A store method whose driver errors leave it as domain errors naming the store (`RunStore.WHAT`)."""

    @functools.wraps(fn)
    def wrapper(self: RunStore, *args: Any, **kwargs: Any) -> Any:
        with mapped_errors(self.WHAT):
            return fn(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def new_run(run_id: str, team: str, name: str, state: ExperimentState, reason: str, *, code_uri: str,
            submitted_by: str, **own: Any) -> dict[str, Any]:
    """A new, unsettled run document with the fields of its kind (`own`)."""
    now = time.time()
    return {"_id": run_id, "team": team, "name": name, "state": int(state), "reason": reason, **own,
            "code_uri": code_uri, "submitted_by": submitted_by, "settled": False, "created_at": now,
            "updated_at": now}


class RunStore(Generic[R]):
    """One kind of run's collection. A kind names itself (`KIND`, `WHAT`, its default `COLLECTION`), parses
    its documents (`record`), may leave fields out of its listings (`LISTED`), and says whether a move settles
    the run (`settles`)."""

    KIND: ClassVar[str] = "run"
    WHAT: ClassVar[str] = "run store"
    COLLECTION: ClassVar[str] = "runs"
    LISTED: ClassVar[dict[str, int] | None] = None

    def __init__(self, db: Database, collection: str | None = None):
        self._col = db[collection or self.COLLECTION]

    def record(self, doc: Mapping) -> R:
        raise NotImplementedError

    def settles(self, to: ExperimentState) -> bool:
        """Whether moving to `to` leaves the driver nothing to do (else the move unsettles the run)."""
        return False

    def _parsed(self, doc: Mapping | None) -> R | None:
        return None if doc is None else self.record(doc)

    @mapped
    def ensure_indexes(self) -> None:
        self._col.create_index([("team", 1), ("created_at", DESCENDING)])
        self._col.create_index([("state", 1)])

    def _insert(self, doc: dict[str, Any]) -> R:
        """Store a new run's document; Conflict when its id is taken."""
        try:
            self._col.insert_one(doc)
        except DuplicateKeyError:
            field = f"{self.KIND}_id"
            raise Conflict(f"{self.KIND} id {doc['_id']!r} is already taken",
                           details=[{"field": field, "message": "already taken"}]) from None
        return self.record(doc)

    @mapped
    def find(self, run_id: str) -> R | None:
        """Any team's run (for the platform itself)."""
        return self._parsed(self._col.find_one({"_id": run_id}))

    @mapped
    def get(self, team: str, run_id: str) -> R:
        """Another team's run is NotFound, exactly like a missing one."""
        found = self._parsed(self._col.find_one({"_id": run_id, "team": team}))
        if found is None:
            raise NotFound(f"{self.KIND} {run_id!r} not found")
        return found

    @mapped
    def list(self, team: str, limit: int = 100) -> list[R]:
        """The team's runs, newest first."""
        cursor = self._col.find({"team": team}, self.LISTED).sort(_NEWEST_FIRST).limit(limit)
        return [self.record(doc) for doc in cursor]

    @mapped
    def unsettled(self, wanted: Iterable[ExperimentState] | None = None) -> list[R]:
        """Runs (in these states, if named) that the driver has not yet finished acting on."""
        query: dict[str, Any] = {"settled": False}
        if wanted is not None:
            query["state"] = {"$in": [int(s) for s in wanted]}
        return [self.record(doc) for doc in self._col.find(query)]

    @mapped
    def settle(self, run_id: str, state: ExperimentState | None = None) -> None:
        """Nothing is left for the driver to do (while the run stays in `state`, if named)."""
        query: dict[str, Any] = {"_id": run_id}
        if state is not None:
            query["state"] = int(state)
        self._col.update_one(query, {"$set": {"settled": True}})

    @mapped
    def move(self, run_id: str, to: ExperimentState, reason: str, *,
             only_from: Iterable[ExperimentState]) -> R | None:
        """Compare-and-set of the state; None when the run is in none of `only_from`."""
        doc = self._col.find_one_and_update(
            {"_id": run_id, "state": {"$in": [int(s) for s in only_from]}},
            {"$set": {"state": int(to), "reason": reason, "settled": self.settles(to), "updated_at": time.time()}},
            return_document=ReturnDocument.AFTER)
        return self._parsed(doc)

    def _set(self, run_id: str, fields: dict[str, Any], **where: Any) -> None:
        """A `$set` of `fields` and `updated_at` on the run (where its fields are as `where` says)."""
        self._col.update_one({"_id": run_id, **where}, {"$set": {**fields, "updated_at": time.time()}})

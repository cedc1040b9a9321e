"""Workflows in MongoDB: the one place a workflow document is read or written.

A workflow document holds its nodes (each an experiment recipe, its
`depends_on` and `take`) in a topological order, per node why it was skipped
(a `$set` of `skipped.<node>`, never a `$push`), and its state, changed by a
compare-and-set on the states it may leave. The runner and the use cases are
in services/trainer/experiments/workflows.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from trainforge_services.common.adapters.mongo import (
    DESCENDING,
    Database,
    DuplicateKeyError,
    ReturnDocument,
    mapped_as,
)
from trainforge_services.common.contracts.experiments import EXPERIMENT_ENDED, ExperimentState
from trainforge_services.common.contracts.workflows import Take, WorkflowSpec
from trainforge_services.common.errors import Conflict, NotFound

mapped = mapped_as("workflow store")
COLLECTION = "workflows"


class NodeRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    recipe: dict[str, Any]
    depends_on: tuple[str, ...] = ()
    take: Take = Take.BEST
    skipped: str = ""  # why, once an upstream node failed


class WorkflowRecord(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    id: str
    team: str = ""
    name: str = ""
    state: ExperimentState = ExperimentState.EXPERIMENT_STATE_UNSPECIFIED
    reason: str = ""
    nodes: tuple[NodeRecord, ...] = ()
    code_uri: str = ""
    submitted_by: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0

    def experiment_id(self, index: int) -> str:
        return f"{self.id}-{index}"


def _record(doc: Mapping | None) -> WorkflowRecord | None:
    if doc is None:
        return None
    skipped = doc.get("skipped") or {}
    nodes = tuple(NodeRecord(**{**n, "skipped": skipped.get(str(i), "")}) for i, n in enumerate(doc.get("nodes") or []))
    plain = {k: v for k, v in doc.items() if k in WorkflowRecord.model_fields and k not in ("id", "state", "nodes")}
    return WorkflowRecord(id=doc["_id"], state=ExperimentState(doc.get("state", 0)), nodes=nodes, **plain)


class WorkflowStore:
    def __init__(self, db: Database, collection: str = COLLECTION):
        self._col = db[collection]

    @mapped
    def ensure_indexes(self) -> None:
        self._col.create_index([("team", 1), ("created_at", DESCENDING)])
        self._col.create_index([("state", 1)])

    @mapped
    def insert(self, workflow_id: str, team: str, spec: WorkflowSpec, *, code_uri: str,
               submitted_by: str) -> WorkflowRecord:
        now = time.time()
        nodes = [{"name": n.name, "recipe": n.recipe, "depends_on": list(n.depends_on), "take": n.take.value}
                 for n in spec.nodes]
        reason = f"{len(nodes)} experiments" + "".join(f"; translated {n}" for n in spec.notes)
        doc = {"_id": workflow_id, "team": team, "name": spec.name, "state": int(ExperimentState.EXPERIMENT_RUNNING),
               "reason": reason, "nodes": nodes, "skipped": {}, "settled": False, "code_uri": code_uri,
               "submitted_by": submitted_by, "created_at": now, "updated_at": now}
        try:
            self._col.insert_one(doc)
        except DuplicateKeyError:
            raise Conflict(f"workflow id {workflow_id!r} is already taken",
                           details=[{"field": "workflow_id", "message": "already taken"}]) from None
        return _record(doc)  # type: ignore[return-value]

    @mapped
    def get(self, team: str, workflow_id: str) -> WorkflowRecord:
        found = _record(self._col.find_one({"_id": workflow_id, "team": team}))
        if found is None:
            raise NotFound(f"workflow {workflow_id!r} not found")
        return found

    @mapped
    def list(self, team: str, limit: int) -> list[WorkflowRecord]:
        cursor = self._col.find({"team": team}).sort([("created_at", DESCENDING), ("_id", DESCENDING)]).limit(limit)
        return [r for r in map(_record, cursor) if r is not None]

    @mapped
    def unsettled(self) -> list[WorkflowRecord]:
        return [r for r in map(_record, self._col.find({"settled": False})) if r is not None]

    @mapped
    def skip(self, workflow_id: str, index: int, reason: str) -> None:
        self._col.update_one({"_id": workflow_id}, {"$set": {f"skipped.{index}": reason, "updated_at": time.time()}})

    @mapped
    def move(self, workflow_id: str, to: ExperimentState, reason: str, *,
             only_from: Iterable[ExperimentState]) -> WorkflowRecord | None:
        doc = self._col.find_one_and_update(
            {"_id": workflow_id, "state": {"$in": [int(s) for s in only_from]}},
            {"$set": {"state": int(to), "reason": reason, "settled": to in EXPERIMENT_ENDED and
                      to != ExperimentState.EXPERIMENT_CANCELLED, "updated_at": time.time()}},
            return_document=ReturnDocument.AFTER)
        return _record(doc)

    @mapped
    def settle(self, workflow_id: str) -> None:
        self._col.update_one({"_id": workflow_id}, {"$set": {"settled": True}})

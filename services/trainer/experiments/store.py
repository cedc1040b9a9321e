"""Experiments in MongoDB: the one place an experiment document is read or written.

An experiment's progress lives here, not in the driver's memory: the
planned trials (`plan`, fixed at submit from the seed), and per trial its
generation (bumped when a halt cancels a queued trial, so its resubmission
gets a new, still deterministic job id), its ASHA rung results, the rung it
is stopped at, and its last objective. Every change is a `$set` of dotted
fields (never `$push`: the embedded MongoDB-wire server mangles pushed
sub-documents), and the state changes are compare-and-sets on the state
they start from, so two drivers (or a driver and a user) cannot both win.
The trials themselves are jobs (services/trainer/store.py) carrying
`experiment_id` and `trial`.
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
from trainforge_services.common.contracts.experiments import ExperimentSpec, ExperimentState
from trainforge_services.common.errors import Conflict, NotFound

mapped = mapped_as("experiment store")
COLLECTION = "experiments"


class TrialProgress(BaseModel):
    """What the driver recorded of one trial."""

    model_config = ConfigDict(frozen=True)

    gen: int = 0
    rungs: dict[int, float] = {}
    stopped_at: int | None = None
    objective: float | None = None
    # halted by the experiment's halt (resumed with it), and "<state>:<attempt>" when its metrics were last read
    held: bool = False
    read: str = ""


class ExperimentRecord(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    id: str
    team: str = ""
    name: str = ""
    state: ExperimentState = ExperimentState.EXPERIMENT_STATE_UNSPECIFIED
    reason: str = ""
    spec: dict[str, Any] = {}
    plan: tuple[dict[str, Any], ...] = ()
    trials: dict[int, TrialProgress] = {}
    code_uri: str = ""
    submitted_by: str = ""
    workflow_id: str = ""
    trial_count: int = 0
    best_trial: int | None = None  # stored when the experiment settles (lists show it without the trials)
    created_at: float = 0.0
    updated_at: float = 0.0

    def parsed(self) -> ExperimentSpec:
        return ExperimentSpec.model_validate(self.spec)

    def progress(self, index: int) -> TrialProgress:
        return self.trials.get(index, TrialProgress())

    def trial_job_id(self, index: int) -> str:
        """Deterministic, so a submit repeated after a crash finds the job it made before."""
        gen = self.progress(index).gen
        return f"{self.id}-{index}" if gen == 0 else f"{self.id}-{index}-{gen}"


def _record(doc: Mapping | None) -> ExperimentRecord | None:
    if doc is None:
        return None
    trials = {}
    for key, t in (doc.get("trials") or {}).items():
        rungs = {int(k): float(v) for k, v in (t.get("rungs") or {}).items()}
        trials[int(key)] = TrialProgress(gen=int(t.get("gen", 0)), rungs=rungs, stopped_at=t.get("stopped_at"),
                                         objective=t.get("objective"), held=bool(t.get("held", False)),
                                         read=str(t.get("read", "")))
    plain = {k: v for k, v in doc.items() if k in ExperimentRecord.model_fields
             and k not in ("state", "trials", "plan") and v is not None}
    plain.pop("id", None)
    return ExperimentRecord(id=doc["_id"], state=ExperimentState(doc.get("state", 0)), trials=trials,
                            plan=tuple(doc.get("plan") or ()), **plain)


class ExperimentStore:
    def __init__(self, db: Database, collection: str = COLLECTION):
        self._col = db[collection]

    @mapped
    def ensure_indexes(self) -> None:
        self._col.create_index([("team", 1), ("created_at", DESCENDING)])
        self._col.create_index([("state", 1)])

    @mapped
    def insert(self, experiment_id: str, team: str, spec: ExperimentSpec, plan: list[dict], *,
               code_uri: str = "", submitted_by: str = "", workflow_id: str = "",
               state: ExperimentState = ExperimentState.EXPERIMENT_RUNNING,
               reason: str = "submitted") -> ExperimentRecord:
        now = time.time()
        doc = {"_id": experiment_id, "team": team, "name": spec.name, "state": int(state), "reason": reason,
               "spec": spec.model_dump(mode="json"), "plan": plan, "trials": {}, "code_uri": code_uri,
               "submitted_by": submitted_by, "workflow_id": workflow_id, "trial_count": len(plan), "settled": False, "created_at": now, "updated_at": now}
        try:
            self._col.insert_one(doc)
        except DuplicateKeyError:
            raise Conflict(f"experiment id {experiment_id!r} is already taken",
                           details=[{"field": "experiment_id", "message": "already taken"}]) from None
        return _record(doc)  # type: ignore[return-value]

    @mapped
    def find(self, experiment_id: str) -> ExperimentRecord | None:
        return _record(self._col.find_one({"_id": experiment_id}))

    @mapped
    def get(self, team: str, experiment_id: str) -> ExperimentRecord:
        """Another team's experiment is NotFound, exactly like a missing one."""
        found = _record(self._col.find_one({"_id": experiment_id, "team": team}))
        if found is None:
            raise NotFound(f"experiment {experiment_id!r} not found")
        return found

    @mapped
    def list(self, team: str, limit: int = 100) -> list[ExperimentRecord]:
        cursor = self._col.find({"team": team}, {"plan": 0}).sort([("created_at", DESCENDING), ("_id", DESCENDING)])
        return [r for r in map(_record, cursor.limit(limit)) if r is not None]

    @mapped
    def in_states(self, wanted: Iterable[ExperimentState]) -> list[ExperimentRecord]:
        docs = self._col.find({"state": {"$in": [int(s) for s in wanted]}})
        return [r for r in map(_record, docs) if r is not None]

    @mapped
    def unsettled(self, wanted: Iterable[ExperimentState]) -> list[ExperimentRecord]:
        """Experiments in these states that the driver has not yet finished acting on."""
        docs = self._col.find({"state": {"$in": [int(s) for s in wanted]}, "settled": False})
        return [r for r in map(_record, docs) if r is not None]

    @mapped
    def settle(self, experiment_id: str, state: ExperimentState) -> None:
        """Nothing is left for the driver to do while the experiment stays in `state`."""
        self._col.update_one({"_id": experiment_id, "state": int(state)}, {"$set": {"settled": True}})

    @mapped
    def move(self, experiment_id: str, to: ExperimentState, reason: str, *,
             only_from: Iterable[ExperimentState]) -> ExperimentRecord | None:
        """Compare-and-set of the state; None when the experiment is in none of `only_from`."""
        doc = self._col.find_one_and_update(
            {"_id": experiment_id, "state": {"$in": [int(s) for s in only_from]}},
            {"$set": {"state": int(to), "reason": reason, "settled": False, "updated_at": time.time()}},
            return_document=ReturnDocument.AFTER)
        return _record(doc)

    @mapped
    def set_trial(self, experiment_id: str, index: int, **fields: Any) -> None:
        """Record trial fields (gen, stopped_at, objective) and rung values (`rungs={k: v}`)."""
        update: dict[str, Any] = {"updated_at": time.time()}
        for name, value in fields.items():
            if name == "rungs":
                update.update({f"trials.{index}.rungs.{k}": float(v) for k, v in value.items()})
            else:
                update[f"trials.{index}.{name}"] = value
        self._col.update_one({"_id": experiment_id}, {"$set": update})

    @mapped
    def set_best(self, experiment_id: str, best: int | None) -> None:
        self._col.update_one({"_id": experiment_id}, {"$set": {"best_trial": best}})

    @mapped
    def set_reason(self, experiment_id: str, reason: str, *, state: ExperimentState) -> None:
        self._col.update_one({"_id": experiment_id, "state": int(state)},
                             {"$set": {"reason": reason, "updated_at": time.time()}})

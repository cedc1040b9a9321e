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
`experiment_id` and `trial`. What every run of many jobs shares (ids,
states, settling, listing) is run_store.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from trainforge_services.common.contracts.experiments import ExperimentSpec, ExperimentState
from trainforge_services.common.states import JobState
from trainforge_services.trainer.experiments.run_store import RunRecord, RunStore, mapped, new_run
from trainforge_services.trainer.record import JobRecord

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


class ExperimentRecord(RunRecord):
    spec: dict[str, Any] = {}
    plan: tuple[dict[str, Any], ...] = ()
    trials: dict[int, TrialProgress] = {}
    workflow_id: str = ""
    trial_count: int = 0
    best_trial: int | None = None  # stored when the experiment settles (lists show it without the trials)

    def parsed(self) -> ExperimentSpec:
        return ExperimentSpec.model_validate(self.spec)

    def progress(self, index: int) -> TrialProgress:
        return self.trials.get(index, TrialProgress())

    def trial_job_id(self, index: int) -> str:
        """Deterministic, so a submit repeated after a crash finds the job it made before."""
        gen = self.progress(index).gen
        return f"{self.id}-{index}" if gen == 0 else f"{self.id}-{index}-{gen}"


def best_trial(exp: ExperimentRecord, spec: ExperimentSpec, jobs: dict[int, JobRecord]) -> int | None:
    """The trial with the best objective, among completed trials when any completed; None without values."""
    if spec.objective is None:
        return None
    scored = {i: exp.progress(i).objective for i in jobs if exp.progress(i).objective is not None}
    completed = {i: v for i, v in scored.items() if jobs[i].state == JobState.COMPLETED}
    pool = completed or scored
    if not pool:
        return None
    sign = 1.0 if spec.objective.goal.value == "minimize" else -1.0
    return min(pool, key=lambda i: (sign * pool[i], i))  # type: ignore[operator]


class ExperimentStore(RunStore[ExperimentRecord]):
    KIND = "experiment"
    WHAT = "experiment store"
    COLLECTION = COLLECTION
    LISTED = {"plan": 0}  # a listing shows no trials

    def record(self, doc: Mapping) -> ExperimentRecord:
        trials = {}
        for key, t in (doc.get("trials") or {}).items():
            rungs = {int(k): float(v) for k, v in (t.get("rungs") or {}).items()}
            trials[int(key)] = TrialProgress(gen=int(t.get("gen", 0)), rungs=rungs, stopped_at=t.get("stopped_at"),
                                             objective=t.get("objective"), held=bool(t.get("held", False)),
                                             read=str(t.get("read", "")))
        plain = {k: v for k, v in doc.items() if k in ExperimentRecord.model_fields
                 and k not in ("id", "state", "trials", "plan") and v is not None}
        return ExperimentRecord(id=doc["_id"], state=ExperimentState(doc.get("state", 0)), trials=trials,
                                plan=tuple(doc.get("plan") or ()), **plain)

    @mapped
    def insert(self, experiment_id: str, team: str, spec: ExperimentSpec, plan: list[dict], *,
               code_uri: str = "", submitted_by: str = "", workflow_id: str = "",
               state: ExperimentState = ExperimentState.EXPERIMENT_RUNNING,
               reason: str = "submitted") -> ExperimentRecord:
        return self._insert(new_run(experiment_id, team, spec.name, state, reason, code_uri=code_uri,
                                    submitted_by=submitted_by, spec=spec.model_dump(mode="json"), plan=plan,
                                    trials={}, workflow_id=workflow_id, trial_count=len(plan)))

    @mapped
    def set_trial(self, experiment_id: str, index: int, **fields: Any) -> None:
        """Record trial fields (gen, stopped_at, objective) and rung values (`rungs={k: v}`)."""
        update: dict[str, Any] = {}
        for name, value in fields.items():
            if name == "rungs":
                update.update({f"trials.{index}.rungs.{k}": float(v) for k, v in value.items()})
            else:
                update[f"trials.{index}.{name}"] = value
        self._set(experiment_id, update)

    @mapped
    def set_best(self, experiment_id: str, best: int | None) -> None:
        self._col.update_one({"_id": experiment_id}, {"$set": {"best_trial": best}})

"""Workflows: DAGs of experiments, stored in MongoDB and advanced by the experiment driver's passes.

A workflow document holds its nodes (each an experiment recipe, its
`depends_on` and `take`) in a topological order, and per node whether it
was skipped and why. Node i's experiment has the deterministic id
`<workflow>-<i>`, so a pass repeated after a crash finds the experiment it
made (Conflict on the id) instead of starting a second one. A pass starts a
node once every node it depends on completed, with their chosen trials'
outputs as `data:` (services/common/contracts/workflows.py `inputs_for`);
skips it, naming the upstream node and its reason, once one of them failed,
was cancelled or skipped; and settles the workflow when every node ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from services.common.adapters.mongo import DESCENDING, Database, DuplicateKeyError, ReturnDocument, mapped_as
from services.common.contracts.experiments import (
    EXPERIMENT_ENDED,
    ExperimentState,
    load_recipe,
    parse_experiment,
)
from services.common.contracts.ids import check_job_id, new_workflow_id
from services.common.contracts.sampling import plan_trials
from services.common.contracts.workflows import Take, WorkflowSpec, inputs_for, parse_workflow, with_inputs
from services.common.errors import Conflict, InvalidArgument, NotFound
from services.common.states import JobState

log = logging.getLogger(__name__)
mapped = mapped_as("workflow store")
COLLECTION = "workflows"
# a node's experiment id is "<workflow>-<node>", and its trials' job ids add "-<trial>-<gen>"
MAX_WORKFLOW_ID = 24
_FAILED = (ExperimentState.EXPERIMENT_FAILED, ExperimentState.EXPERIMENT_CANCELLED)


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


class WorkflowRunner:
    """One pass over a workflow; `experiments` is the ExperimentService (create, view, cancel)."""

    def __init__(self, store: WorkflowStore, experiments: Any):
        self._store = store
        self._experiments = experiments

    def tick(self) -> None:
        for wf in self._store.unsettled():
            self.advance(wf)

    def advance(self, wf: WorkflowRecord) -> None:
        views = {i: self._experiments.find_view(wf.experiment_id(i)) for i in range(len(wf.nodes))}
        if wf.state == ExperimentState.EXPERIMENT_CANCELLED:
            for i, view in views.items():
                if view is not None and view.experiment.state not in EXPERIMENT_ENDED:
                    self._experiments.cancel(wf.team, wf.experiment_id(i), "workflow")
            self._store.settle(wf.id)
            return
        index_of = {n.name: i for i, n in enumerate(wf.nodes)}
        for i, node in enumerate(wf.nodes):
            if views[i] is not None or node.skipped:
                continue
            ups = [index_of[d] for d in node.depends_on]
            bad = next((u for u in ups if wf.nodes[u].skipped or (views[u] is not None and
                                                                   views[u].experiment.state in _FAILED)), None)
            if bad is not None:
                up = wf.nodes[bad]
                why = f"skipped: {up.name} was skipped" if up.skipped else \
                    f"{up.name} {_name(views[bad].experiment.state)}: {views[bad].experiment.reason}"
                self._store.skip(wf.id, i, f"not run: upstream {why}")
                wf = wf.model_copy(update={"nodes": tuple(n.model_copy(update={"skipped": "upstream"}) if k == i
                                                          else n for k, n in enumerate(wf.nodes))})
                continue
            if all(views[u] is not None and views[u].experiment.state == ExperimentState.EXPERIMENT_COMPLETED
                   for u in ups):
                self._start(wf, i, node, [(wf.nodes[u], views[u]) for u in ups])
        self._maybe_finish(wf, views)

    def _start(self, wf: WorkflowRecord, index: int, node: NodeRecord, upstream: list) -> None:
        spec = parse_experiment(node.recipe)
        data = []
        for up, view in upstream:
            done = [(t, view.jobs[t].id) for t in sorted(view.jobs) if view.jobs[t].state == JobState.COMPLETED]
            if node.take == Take.BEST and view.best is not None:
                done = [(view.best, view.jobs[view.best].id)]
            data += inputs_for(up.name, node.take, done)
        spec = with_inputs(spec, data)
        try:
            self._experiments.create(wf.team, spec, plan_trials(spec), code_uri=wf.code_uri,
                                     submitted_by=wf.submitted_by, experiment_id=wf.experiment_id(index),
                                     workflow_id=wf.id)
            log.info("workflow %s: started %s as %s", wf.id, node.name, wf.experiment_id(index))
        except Conflict as e:
            if "already taken" not in e.message:
                raise  # made by a pass that died before it could see it: it exists once
        except InvalidArgument as e:  # e.g. bigger than the team's quota: it can never run
            self._store.skip(wf.id, index, f"not run: {e.message}")

    def _maybe_finish(self, wf: WorkflowRecord, views: dict) -> None:
        fresh = self._store.get(wf.team, wf.id)
        views = {i: self._experiments.find_view(wf.experiment_id(i)) for i in range(len(fresh.nodes))}
        ended = all(n.skipped or (views[i] is not None and views[i].experiment.state in EXPERIMENT_ENDED)
                    for i, n in enumerate(fresh.nodes))
        if not ended:
            return
        bad = [n.name for i, n in enumerate(fresh.nodes)
               if n.skipped or views[i].experiment.state != ExperimentState.EXPERIMENT_COMPLETED]
        to = ExperimentState.EXPERIMENT_FAILED if bad else ExperimentState.EXPERIMENT_COMPLETED
        reason = f"{len(fresh.nodes) - len(bad)} of {len(fresh.nodes)} experiments completed" + \
            (f"; not completed: {', '.join(bad)}" if bad else "")
        self._store.move(wf.id, to, reason, only_from=[ExperimentState.EXPERIMENT_RUNNING])


def _name(state: ExperimentState) -> str:
    return state.name.removeprefix("EXPERIMENT_").lower()


class WorkflowService:
    """The workflow use cases behind the RPCs: submit (validated DAG), get, list, cancel."""

    def __init__(self, store: WorkflowStore, experiments: Any, wake: Any):
        self._store = store
        self._experiments = experiments
        self._wake = wake

    def submit(self, team: str, recipe: str, *, code_uri: str = "", submitted_by: str = "",
               workflow_id: str = "") -> WorkflowRecord:
        if not team:
            raise InvalidArgument("team is required", details=[{"field": "team", "message": "required"}])
        spec = parse_workflow(load_recipe(recipe))
        workflow_id = check_job_id(workflow_id or new_workflow_id(), "workflow_id")
        if len(workflow_id) > MAX_WORKFLOW_ID:
            raise InvalidArgument(f"workflow_id: at most {MAX_WORKFLOW_ID} characters",
                                  details=[{"field": "workflow_id", "message": f"at most {MAX_WORKFLOW_ID} characters"}])
        wf = self._store.insert(workflow_id, team, spec, code_uri=code_uri, submitted_by=submitted_by)
        self._wake()
        return wf

    def get(self, team: str, workflow_id: str) -> WorkflowRecord:
        return self._store.get(team, workflow_id)

    def nodes(self, wf: WorkflowRecord) -> list[Any]:
        """Each node's experiment view (None while not started)."""
        return [self._experiments.find_view(wf.experiment_id(i)) for i in range(len(wf.nodes))]

    def list(self, team: str, limit: int = 0) -> list[WorkflowRecord]:
        return self._store.list(team, min(limit or 100, 1000))

    def cancel(self, team: str, workflow_id: str, actor: str) -> WorkflowRecord:
        wf = self._store.get(team, workflow_id)
        if wf.state == ExperimentState.EXPERIMENT_CANCELLED:
            return wf
        moved = self._store.move(wf.id, ExperimentState.EXPERIMENT_CANCELLED, f"cancelled by {actor or 'user'}",
                                 only_from=[ExperimentState.EXPERIMENT_RUNNING])
        if moved is None:
            raise Conflict(f"workflow {workflow_id!r} already {_name(wf.state)}; only a running workflow can be "
                           "cancelled")
        self._wake()
        return moved

"""Workflows in MongoDB: the one place a workflow document is read or written.

A workflow document holds its nodes (each an experiment recipe, its
`depends_on` and `take`) in a topological order, per node why it was skipped
(a `$set` of `skipped.<node>`, never a `$push`), and its state, changed by a
compare-and-set on the states it may leave. The runner and the use cases are
in services/trainer/experiments/workflows.py; what every run of many jobs
shares (ids, states, settling, listing) is run_store.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from trainforge_services.common.contracts.experiments import EXPERIMENT_ENDED, ExperimentState
from trainforge_services.common.contracts.workflows import Take, WorkflowSpec
from trainforge_services.trainer.experiments.run_store import RunRecord, RunStore, mapped, new_run

COLLECTION = "workflows"


class NodeRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    recipe: dict[str, Any]
    depends_on: tuple[str, ...] = ()
    take: Take = Take.BEST
    skipped: str = ""  # why, once an upstream node failed


class WorkflowRecord(RunRecord):
    nodes: tuple[NodeRecord, ...] = ()

    def experiment_id(self, index: int) -> str:
        return f"{self.id}-{index}"


class WorkflowStore(RunStore[WorkflowRecord]):
    KIND = "workflow"
    WHAT = "workflow store"
    COLLECTION = COLLECTION

    def record(self, doc: Mapping) -> WorkflowRecord:
        skipped = doc.get("skipped") or {}
        nodes = tuple(NodeRecord(**{**n, "skipped": skipped.get(str(i), "")})
                      for i, n in enumerate(doc.get("nodes") or []))
        plain = {k: v for k, v in doc.items() if k in WorkflowRecord.model_fields and k not in ("id", "state", "nodes")}
        return WorkflowRecord(id=doc["_id"], state=ExperimentState(doc.get("state", 0)), nodes=nodes, **plain)

    def settles(self, to: ExperimentState) -> bool:
        # a cancelled workflow's runner still cancels the experiments it started, then settles it
        return to in EXPERIMENT_ENDED and to != ExperimentState.EXPERIMENT_CANCELLED

    @mapped
    def insert(self, workflow_id: str, team: str, spec: WorkflowSpec, *, code_uri: str,
               submitted_by: str) -> WorkflowRecord:
        nodes = [{"name": n.name, "recipe": n.recipe, "depends_on": list(n.depends_on), "take": n.take.value}
                 for n in spec.nodes]
        reason = f"{len(nodes)} experiments" + "".join(f"; translated {n}" for n in spec.notes)
        return self._insert(new_run(workflow_id, team, spec.name, ExperimentState.EXPERIMENT_RUNNING, reason,
                                    code_uri=code_uri, submitted_by=submitted_by, nodes=nodes, skipped={}))

    @mapped
    def skip(self, workflow_id: str, index: int, reason: str) -> None:
        self._set(workflow_id, {f"skipped.{index}": reason})

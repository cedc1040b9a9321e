"""Workflows: DAGs of experiments (stored by workflow_store.py), advanced by the experiment driver's passes.

Node i's experiment has the deterministic id
`<workflow>-<i>`, so a pass repeated after a crash finds the experiment it
made (Conflict on the id) instead of starting a second one. A pass starts a
node once every node it depends on completed, with their chosen trials'
outputs as `data:` (services/common/contracts/workflows.py `inputs_for`);
skips it, naming the upstream node and its reason, once one of them failed,
was cancelled or skipped; and settles the workflow when every node ended.
"""

from __future__ import annotations

import logging
from typing import Any

from trainforge_services.common.contracts.experiments import (
    EXPERIMENT_ENDED,
    ExperimentState,
    load_recipe,
    parse_experiment,
)
from trainforge_services.common.contracts.ids import new_workflow_id
from trainforge_services.common.contracts.sampling import plan_trials
from trainforge_services.common.contracts.workflows import Take, inputs_for, parse_workflow, with_inputs
from trainforge_services.common.errors import Conflict, InvalidArgument, PermissionDenied
from trainforge_services.common.states import JobState
from trainforge_services.trainer.experiments.runs import RunService, state_name
from trainforge_services.trainer.experiments.workflow_store import NodeRecord, WorkflowRecord, WorkflowStore

log = logging.getLogger(__name__)
_FAILED = (ExperimentState.EXPERIMENT_FAILED, ExperimentState.EXPERIMENT_CANCELLED)


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
                    f"{up.name} {state_name(views[bad].experiment.state)}: {views[bad].experiment.reason}"
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
        except (InvalidArgument, PermissionDenied) as e:  # e.g. bigger than the team's quota: it can never run
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



class WorkflowService(RunService[WorkflowRecord]):
    """The workflow use cases behind the RPCs: submit (validated DAG), get, list, cancel."""

    KIND = "workflow"
    MAX_ID = 24  # a node's experiment id is "<workflow>-<node>", and its trials' job ids add "-<trial>-<gen>"

    def __init__(self, store: WorkflowStore, experiments: Any, wake: Any):
        super().__init__(store, wake)
        self._workflows = store
        self._experiments = experiments

    def submit(self, team: str, recipe: str, *, code_uri: str = "", submitted_by: str = "",
               workflow_id: str = "") -> WorkflowRecord:
        self.require_team(team)
        spec = parse_workflow(load_recipe(recipe))
        workflow_id = self.check_id(workflow_id or new_workflow_id())
        for node in spec.nodes:  # a node's inputs from upstream are checked when its experiment is made
            self._experiments.refs.reads(team, parse_experiment(node.recipe).template, field=f"{node.name}.template.")
        wf = self._workflows.insert(workflow_id, team, spec, code_uri=code_uri, submitted_by=submitted_by)
        self._wake()
        return wf

    def get(self, team: str, workflow_id: str) -> WorkflowRecord:
        return self._store.get(team, workflow_id)

    def nodes(self, wf: WorkflowRecord) -> list[Any]:
        """Each node's experiment view (None while not started)."""
        return [self._experiments.find_view(wf.experiment_id(i)) for i in range(len(wf.nodes))]

    def cancel(self, team: str, workflow_id: str, actor: str) -> WorkflowRecord:
        return self._move(team, workflow_id, ExperimentState.EXPERIMENT_CANCELLED, f"cancelled by {actor or 'user'}",
                          [ExperimentState.EXPERIMENT_RUNNING],
                          lambda wf: f"already {state_name(wf.state)}; only a running workflow can be cancelled")

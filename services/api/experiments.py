"""Experiments at the REST boundary: submit (recipe + code), the REST shape, and the Trainer calls.

The recipe is validated here first (services/common/contracts/recipes.py, the
same function the Trainer runs), so a bad field is a 422 before any code is
stored. The code archive goes to `store://experiments/<id>/code.tar.gz` and
every trial runs it. The trial table is sorted by the objective (best first,
trials without a value last), and the best trial is flagged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import BinaryIO

from trainforge_protos import trainer_pb2, trainer_pb2_grpc
from trainforge_services.api.identity import Tenant
from trainforge_services.api.submit import store_code
from trainforge_services.api.trainer_client import job_state_name
from trainforge_services.common import rpc
from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.contracts.experiments import ExperimentState, load_recipe
from trainforge_services.common.contracts.ids import new_experiment_id, new_workflow_id
from trainforge_services.common.contracts.recipes import experiment_from_recipe
from trainforge_services.common.contracts.storekeys import experiment_code_key
from trainforge_services.common.contracts.workflows import parse_workflow
from trainforge_services.common.errors import TrainforgeError


def experiment_state_name(state: int) -> str:
    return "unspecified" if state == 0 else ExperimentState(state).name.removeprefix("EXPERIMENT_").lower()


def trial_to_json(t: trainer_pb2.Trial, best: int | None) -> dict:
    return {"index": t.index, "job_id": t.job_id or None,
            "state": "not_submitted" if not t.state else job_state_name(t.state),
            "params": json.loads(t.params_json or "{}"),
            "objective": t.objective if t.HasField("objective") else None,
            "stopped_at_rung": t.stopped_at_rung if t.HasField("stopped_at_rung") else None,
            "rungs": {str(k): v for k, v in sorted(t.rungs.items())}, "reason": t.reason,
            "best": best is not None and t.index == best}


def experiment_to_json(exp: trainer_pb2.Experiment, *, with_trials: bool = True) -> dict:
    spec = json.loads(exp.spec_json or "{}")
    best = exp.best_trial if exp.HasField("best_trial") else None
    goal = ((spec.get("objective") or {}).get("goal")) or "minimize"
    trials = [trial_to_json(t, best) for t in exp.trials] if with_trials else []
    sign = 1.0 if goal == "minimize" else -1.0
    trials.sort(key=lambda t: (t["objective"] is None, sign * (t["objective"] or 0.0), t["index"]))
    return {"id": exp.id, "team": exp.team, "name": exp.name, "state": experiment_state_name(exp.state),
            "reason": exp.reason, "objective": spec.get("objective"), "trial_count": exp.trial_count,
            "best_trial": best, "trials": trials, "spec": spec, "code_uri": exp.code_uri,
            "submitted_by": exp.submitted_by, "created_at": exp.created_at, "updated_at": exp.updated_at}


def workflow_to_json(wf: trainer_pb2.Workflow) -> dict:
    nodes = [{"name": n.name, "depends_on": list(n.depends_on), "take": n.take, "experiment_id": n.experiment_id or None,
              "state": "skipped" if n.skipped else ("waiting" if not n.state else experiment_state_name(n.state)),
              "reason": n.reason, "best_trial": n.best_trial if n.HasField("best_trial") else None}
             for n in wf.nodes]
    return {"id": wf.id, "team": wf.team, "name": wf.name, "state": experiment_state_name(wf.state),
            "reason": wf.reason, "nodes": nodes, "code_uri": wf.code_uri, "submitted_by": wf.submitted_by,
            "created_at": wf.created_at, "updated_at": wf.updated_at}


class ExperimentCalls:
    """The Trainer's experiment RPCs, answering REST-shaped dicts (errors come back as domain errors)."""

    def __init__(self, address: str, timeout: float = 30.0):
        self._channel = rpc.channel(address)
        self._stub = trainer_pb2_grpc.TrainerStub(self._channel)
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def submit(self, *, team: str, recipe: str, code_uri: str, submitted_by: str, experiment_id: str) -> dict:
        req = trainer_pb2.SubmitExperimentRequest(team=team, recipe=recipe, code_uri=code_uri,
                                                  submitted_by=submitted_by, experiment_id=experiment_id)
        return experiment_to_json(rpc.call(self._stub.SubmitExperiment, req, self._timeout))

    def get(self, team: str, experiment_id: str) -> dict:
        req = trainer_pb2.GetExperimentRequest(team=team, experiment_id=experiment_id)
        return experiment_to_json(rpc.call(self._stub.GetExperiment, req, self._timeout))

    def list(self, team: str, limit: int) -> list[dict]:
        resp = rpc.call(self._stub.ListExperiments, trainer_pb2.ListExperimentsRequest(team=team, limit=limit),
                        self._timeout)
        return [experiment_to_json(e, with_trials=False) for e in resp.experiments]

    def act(self, action: str, team: str, experiment_id: str, actor: str) -> dict:
        method = {"cancel": self._stub.CancelExperiment, "halt": self._stub.HaltExperiment,
                  "resume": self._stub.ResumeExperiment}[action]
        req = trainer_pb2.ExperimentAction(team=team, experiment_id=experiment_id, actor=actor)
        return experiment_to_json(rpc.call(method, req, self._timeout))

    def submit_workflow(self, *, team: str, recipe: str, code_uri: str, submitted_by: str, workflow_id: str) -> dict:
        req = trainer_pb2.SubmitWorkflowRequest(team=team, recipe=recipe, code_uri=code_uri,
                                                submitted_by=submitted_by, workflow_id=workflow_id)
        return workflow_to_json(rpc.call(self._stub.SubmitWorkflow, req, self._timeout))

    def get_workflow(self, team: str, workflow_id: str) -> dict:
        req = trainer_pb2.GetWorkflowRequest(team=team, workflow_id=workflow_id)
        return workflow_to_json(rpc.call(self._stub.GetWorkflow, req, self._timeout))

    def list_workflows(self, team: str, limit: int) -> list[dict]:
        resp = rpc.call(self._stub.ListWorkflows, trainer_pb2.ListWorkflowsRequest(team=team, limit=limit),
                        self._timeout)
        return [workflow_to_json(w) for w in resp.workflows]

    def cancel_workflow(self, team: str, workflow_id: str, actor: str) -> dict:
        req = trainer_pb2.WorkflowAction(team=team, workflow_id=workflow_id, actor=actor)
        return workflow_to_json(rpc.call(self._stub.CancelWorkflow, req, self._timeout))


def submit_workflow(calls: ExperimentCalls, objects: ObjectStore, tenant: Tenant, *, recipe: str,
                    code: BinaryIO | None, code_size: int | None, max_upload_bytes: int) -> dict:
    parse_workflow(load_recipe(recipe))  # every bad field is a 422 before anything is stored
    workflow_id = new_workflow_id()
    return _with_code(objects, experiment_code_key(workflow_id), code, code_size, max_upload_bytes,
                      lambda code_uri: calls.submit_workflow(team=tenant.team, recipe=recipe, code_uri=code_uri,
                                                             submitted_by=tenant.key_id, workflow_id=workflow_id))


def submit_experiment(calls: ExperimentCalls, objects: ObjectStore, tenant: Tenant, *, recipe: str,
                      code: BinaryIO | None, code_size: int | None, max_upload_bytes: int) -> dict:
    experiment_from_recipe(recipe)  # every bad field is a 422 before anything is stored
    experiment_id = new_experiment_id()
    return _with_code(objects, experiment_code_key(experiment_id), code, code_size, max_upload_bytes,
                      lambda code_uri: calls.submit(team=tenant.team, recipe=recipe, code_uri=code_uri,
                                                    submitted_by=tenant.key_id, experiment_id=experiment_id))


def _with_code(objects: ObjectStore, key: str, code: BinaryIO | None, code_size: int | None, limit: int,
               submit: Callable[[str], dict]) -> dict:
    """Store the code archive (if any) at `key`, then `submit(code_uri)`; a refused submit leaves no archive."""
    code_uri = store_code(objects, key, code, code_size, limit) if code is not None else ""
    try:
        return submit(code_uri)
    except TrainforgeError:
        if code_uri:
            objects.delete_prefix(key)
        raise

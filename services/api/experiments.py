"""Experiments and workflows at the REST boundary: submit (recipe + code), the REST shapes, and the Trainer calls.

Both are runs of many jobs, called alike (`RunCalls`, one per `RunKind`). The
recipe is validated here first (services/common/contracts/recipes.py and
workflows.py, the functions the Trainer runs), so a bad field is a 422
before any code is stored. The code archive goes to
`store://experiments/<id>/code.tar.gz` and every trial (every node's trials)
runs it. The trial table is sorted by the objective (best first, trials
without a value last), and the best trial is flagged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

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


@dataclass(frozen=True)
class RunKind:
    """What the REST boundary knows of one kind of run; its RPCs are named after `noun` (`Submit<Noun>` with a
    `Submit<Noun>Request`, `Get<Noun>`, `List<Noun>s`, `<Action><Noun>` with a `<Noun>Action`)."""

    noun: str
    validate: Callable[[str], object]  # the recipe's check: every bad field a 422 before anything is stored
    new_id: Callable[[], str]
    to_json: Callable[[Any], dict]
    listed_json: Callable[[Any], dict]  # as a listing shows it


EXPERIMENT = RunKind("experiment", experiment_from_recipe, new_experiment_id, experiment_to_json,
                     lambda e: experiment_to_json(e, with_trials=False))
WORKFLOW = RunKind("workflow", lambda recipe: parse_workflow(load_recipe(recipe)), new_workflow_id, workflow_to_json,
                   workflow_to_json)


class RunCalls:
    """One kind's Trainer RPCs, answering REST-shaped dicts (errors come back as domain errors)."""

    def __init__(self, stub: trainer_pb2_grpc.TrainerStub, timeout: float, kind: RunKind):
        self.kind = kind
        self._stub = stub
        self._timeout = timeout
        self._noun = kind.noun.capitalize()

    def _call(self, method: str, request_type: str, **fields: Any) -> Any:
        request = getattr(trainer_pb2, request_type)(**fields)
        return rpc.call(getattr(self._stub, method), request, self._timeout)

    def submit(self, *, team: str, recipe: str, code_uri: str, submitted_by: str, run_id: str) -> dict:
        return self.kind.to_json(self._call(f"Submit{self._noun}", f"Submit{self._noun}Request", team=team,
                                            recipe=recipe, code_uri=code_uri, submitted_by=submitted_by,
                                            **{f"{self.kind.noun}_id": run_id}))

    def get(self, team: str, run_id: str) -> dict:
        return self.kind.to_json(self._call(f"Get{self._noun}", f"Get{self._noun}Request", team=team,
                                            **{f"{self.kind.noun}_id": run_id}))

    def list(self, team: str, limit: int) -> list[dict]:
        resp = self._call(f"List{self._noun}s", f"List{self._noun}sRequest", team=team, limit=limit)
        return [self.kind.listed_json(r) for r in getattr(resp, f"{self.kind.noun}s")]

    def act(self, action: str, team: str, run_id: str, actor: str) -> dict:
        """cancel (either kind), halt or resume (an experiment)."""
        return self.kind.to_json(self._call(f"{action.capitalize()}{self._noun}", f"{self._noun}Action", team=team,
                                            actor=actor, **{f"{self.kind.noun}_id": run_id}))


class ExperimentCalls:
    """The Trainer's experiment and workflow RPCs over one channel: `.experiments` and `.workflows`."""

    def __init__(self, address: str, timeout: float = 30.0, *, authorization: str | Callable[[], str] = ""):
        self._channel = rpc.channel(address, authorization=authorization)
        stub = trainer_pb2_grpc.TrainerStub(self._channel)
        self.experiments = RunCalls(stub, timeout, EXPERIMENT)
        self.workflows = RunCalls(stub, timeout, WORKFLOW)

    def close(self) -> None:
        self._channel.close()


def submit_run(calls: RunCalls, objects: ObjectStore, tenant: Tenant, *, recipe: str, code: BinaryIO | None,
               code_size: int | None, max_upload_bytes: int) -> dict:
    """Validate the recipe, store the code archive (if any) under the new run's id, then submit the run; a
    refused submit leaves no archive."""
    calls.kind.validate(recipe)
    run_id = calls.kind.new_id()
    key = experiment_code_key(run_id)
    code_uri = store_code(objects, key, code, code_size, max_upload_bytes) if code is not None else ""
    try:
        return calls.submit(team=tenant.team, recipe=recipe, code_uri=code_uri, submitted_by=tenant.key_id,
                            run_id=run_id)
    except TrainforgeError:
        if code_uri:
            objects.delete_prefix(key)
        raise

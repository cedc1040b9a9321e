"""Experiments as the wire sees them (`trainer_pb2.Experiment`, `Trial`): the one conversion."""

from __future__ import annotations

import json

from trainforge_protos import trainer_pb2
from trainforge_services.common.states import JobState
from trainforge_services.trainer.experiments.service import ExperimentView
from trainforge_services.trainer.experiments.store import ExperimentRecord
from trainforge_services.trainer.experiments.workflow_store import WorkflowRecord


def experiment_to_proto(exp: ExperimentRecord, view: ExperimentView | None = None) -> trainer_pb2.Experiment:
    """With a view, the trials (every planned one, submitted or not) and the best trial too."""
    msg = trainer_pb2.Experiment(
        id=exp.id, team=exp.team, name=exp.name, state=int(exp.state), reason=exp.reason,
        spec_json=json.dumps(exp.spec), code_uri=exp.code_uri, submitted_by=exp.submitted_by,
        created_at=exp.created_at, updated_at=exp.updated_at, trial_count=exp.trial_count or len(exp.plan),
        workflow_id=exp.workflow_id)
    if view is None:
        if exp.best_trial is not None:
            msg.best_trial = exp.best_trial
        return msg
    for index, values in enumerate(exp.plan):
        progress = exp.progress(index)
        job = view.jobs.get(index)
        trial = trainer_pb2.Trial(index=index, job_id=job.id if job else "",
                                  state=int(job.state if job else JobState.JOB_STATE_UNSPECIFIED),
                                  params_json=json.dumps(values), reason=job.reason if job else "not submitted yet",
                                  rungs={int(k): v for k, v in progress.rungs.items()})
        if progress.objective is not None:
            trial.objective = progress.objective
        if progress.stopped_at is not None:
            trial.stopped_at_rung = progress.stopped_at
        msg.trials.append(trial)
    if view.best is not None:
        msg.best_trial = view.best
    return msg


def view_to_proto(view: ExperimentView) -> trainer_pb2.Experiment:
    return experiment_to_proto(view.experiment, view)


def workflow_to_proto(wf: WorkflowRecord, views: list[ExperimentView | None] | None = None) -> trainer_pb2.Workflow:
    """With the node experiments' views, each node's state, reason and best trial too."""
    msg = trainer_pb2.Workflow(id=wf.id, team=wf.team, name=wf.name, state=int(wf.state), reason=wf.reason,
                               code_uri=wf.code_uri, submitted_by=wf.submitted_by, created_at=wf.created_at,
                               updated_at=wf.updated_at)
    for i, node in enumerate(wf.nodes):
        view = views[i] if views is not None else None
        item = trainer_pb2.WorkflowNode(name=node.name, depends_on=list(node.depends_on), take=node.take.value,
                                        skipped=bool(node.skipped))
        if view is not None:
            item.experiment_id = view.experiment.id
            item.state = int(view.experiment.state)
            item.reason = view.experiment.reason
            if view.best is not None:
                item.best_trial = view.best
        else:
            waiting = ", ".join(node.depends_on) or "the driver"
            item.reason = node.skipped or f"waiting for {waiting}"
        msg.nodes.append(item)
    return msg

"""Workflows through a real Trainer: a DAG of experiments advanced from the store, outputs passed along,
failures stopping descendants with a reason, and the DAG validated at submit (fields named)."""

from __future__ import annotations

import json

import grpc
import pytest

from tests.integration.test_trainer_experiments import TEAM, Env
from tests.servers import wait_for
from trainforge_protos import trainer_pb2
from trainforge_services.common.contracts.experiments import ExperimentState

COMPLETED = ExperimentState.EXPERIMENT_COMPLETED


@pytest.fixture
def env(mongo_server, osmem_server, unique, tmp_path):
    e = Env(mongo_server, osmem_server, unique, tmp_path)
    yield e
    e.close()


def submit(env: Env, recipe: dict) -> trainer_pb2.Workflow:
    return env.stub.SubmitWorkflow(trainer_pb2.SubmitWorkflowRequest(team=TEAM, recipe=json.dumps(recipe),
                                                                     submitted_by="user:k1"))


def get(env: Env, wf_id: str) -> trainer_pb2.Workflow:
    return env.stub.GetWorkflow(trainer_pb2.GetWorkflowRequest(team=TEAM, workflow_id=wf_id))


THREE = {"kind": "workflow", "name": "tune-train-eval", "experiments": {
    "sweep": {"command": "python train.py --lr {{lr}}", "parameters": {"lr": [0.1, 0.2]}, "mode": "grid",
              "max_parallel": 2, "objective": {"metric": "loss", "goal": "minimize"}},
    "train": {"command": "python train.py --long", "depends_on": ["sweep"], "take": "best"},
    "evaluate": {"command": "python eval.py", "depends_on": ["train"]},
}}


def test_a_three_node_workflow_passes_the_best_trials_outputs_downstream(env):
    wf = submit(env, THREE)
    assert [n.name for n in wf.nodes] == ["sweep", "train", "evaluate"]
    sweep = wait_for(lambda: get(env, wf.id).nodes[0].experiment_id, 15, "the sweep to start")
    assert not get(env, wf.id).nodes[1].experiment_id and "waiting for sweep" in get(env, wf.id).nodes[1].reason
    for index, loss in enumerate([0.7, 0.2]):
        job = f"{sweep}-{index}"
        env.run(job)
        env.report_metric(job, {"step": 1, "loss": loss})
        env.complete(job)
    train = wait_for(lambda: get(env, wf.id).nodes[1].experiment_id, 15, "train to start")
    job = env.job(f"{train}-0") or wait_for(lambda: env.job(f"{train}-0"), 15, "train's trial")
    data = job.spec().data
    assert [(d.source, d.path) for d in data] == [(f"store://jobs/{sweep}-1/outputs/", "inputs/sweep/")]
    env.run(job.id)
    env.complete(job.id)
    evaluate = wait_for(lambda: get(env, wf.id).nodes[2].experiment_id, 15, "evaluate to start")
    ev_job = wait_for(lambda: env.job(f"{evaluate}-0"), 15, "evaluate's trial")
    assert [(d.source, d.path) for d in ev_job.spec().data] == [(f"store://jobs/{train}-0/outputs/", "inputs/train/")]
    env.run(ev_job.id)
    env.complete(ev_job.id)
    done = wait_for(lambda: (w := get(env, wf.id)).state == COMPLETED and w, 15, "the workflow to complete")
    assert [n.state for n in done.nodes] == [COMPLETED] * 3 and done.nodes[0].best_trial == 1
    assert "3 of 3 experiments completed" in done.reason


def test_a_failed_node_stops_its_descendants_with_a_reason(env):
    wf = submit(env, THREE)
    sweep = wait_for(lambda: get(env, wf.id).nodes[0].experiment_id, 15, "the sweep to start")
    for index in range(2):
        env.run(f"{sweep}-{index}")
        env.fail(f"{sweep}-{index}")
    done = wait_for(lambda: (w := get(env, wf.id)).state == ExperimentState.EXPERIMENT_FAILED and w, 15,
                    "the workflow to fail")
    train, evaluate = done.nodes[1], done.nodes[2]
    assert train.skipped and not train.experiment_id and "upstream sweep failed" in train.reason
    assert evaluate.skipped and "upstream skipped: train was skipped" in evaluate.reason
    assert "not completed: sweep, train, evaluate" in done.reason


def test_cancelling_a_workflow_cancels_the_running_experiment(env):
    wf = submit(env, THREE)
    sweep = wait_for(lambda: get(env, wf.id).nodes[0].experiment_id, 15, "the sweep to start")
    env.stub.CancelWorkflow(trainer_pb2.WorkflowAction(team=TEAM, workflow_id=wf.id, actor="user:k1"))
    wait_for(lambda: get(env, wf.id).nodes[0].state == ExperimentState.EXPERIMENT_CANCELLED, 15,
             "the sweep to be cancelled")
    assert get(env, wf.id).state == ExperimentState.EXPERIMENT_CANCELLED
    assert sweep


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"train": {"command": "x", "depends_on": ["sweeep"]}}, "experiments.train.depends_on", "unknown experiment"),
    ({"sweep": {**THREE["experiments"]["sweep"], "depends_on": ["evaluate"]}}, "depends_on", "cycle"),
    ({"train": {"command": "x", "depends_on": ["sweep"], "take": "median"}}, "experiments.train.take", "best or all"),
    ({"evaluate": {"command": "x {{missing}}", "depends_on": ["train"]}}, "experiments.evaluate.command", "missing"),
])
def test_the_dag_is_validated_at_submit_naming_fields(env, change, field, words):
    recipe = {**THREE, "experiments": {**THREE["experiments"], **change}}
    with pytest.raises(grpc.RpcError) as e:
        submit(env, recipe)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in e.value.details() and words in e.value.details()

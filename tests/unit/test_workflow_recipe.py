"""Workflow recipes (services/common/contracts/workflows.py): topological order, cycles and unknown names
named by field, node errors under their node, inputs wiring; and the CLI's DAG view."""

from __future__ import annotations

import pytest
from rich.console import Console

from trainforge.cli_experiments import workflow_tree
from trainforge_services.common.contracts.experiments import parse_experiment
from trainforge_services.common.contracts.workflows import Take, inputs_for, parse_workflow, with_inputs
from trainforge_services.common.errors import InvalidArgument


def recipe(**nodes) -> dict:
    return {"kind": "workflow", "name": "wf", "experiments": nodes}


def details(data: dict) -> dict[str, str]:
    with pytest.raises(InvalidArgument) as e:
        parse_workflow(data)
    return {d["field"]: d["message"] for d in e.value.details}


def test_nodes_come_in_a_topological_order_whatever_the_recipe_order():
    wf = parse_workflow(recipe(evaluate={"command": "e", "depends_on": ["train"]},
                               train={"command": "t", "depends_on": ["sweep", "prep"], "take": "all"},
                               sweep={"command": "s {{lr}}", "parameters": {"lr": [1, 2]}},
                               prep={"command": "p"}))
    names = [n.name for n in wf.nodes]
    assert names.index("train") > max(names.index("sweep"), names.index("prep"))
    assert names[-1] == "evaluate" and wf.nodes[names.index("train")].take == Take.ALL


def test_a_cycle_is_named_with_its_path():
    found = details(recipe(a={"command": "a", "depends_on": ["c"]}, b={"command": "b", "depends_on": ["a"]},
                           c={"command": "c", "depends_on": ["b"]}))
    (field, message), = found.items()
    assert field.endswith(".depends_on") and message.startswith("cycle: ")
    path = message.removeprefix("cycle: ").split(" -> ")
    assert path[0] == path[-1] and set(path) == {"a", "b", "c"}


def test_unknown_names_bad_take_and_node_errors_are_named_by_field():
    found = details({**recipe(a={"command": "a {{x}}"}, b={"command": "b", "depends_on": ["nope"], "take": "some"},
                              c={"command": "c", "max_parallel": 0}), "extra": 1})
    assert found["experiments.b.depends_on"] == "unknown experiment 'nope'"
    assert found["experiments.b.take"] == "must be best or all"
    assert "experiments.a.command" in found and "experiments.c.max_parallel" in found
    assert found["extra"] == "unknown field beside experiments"


def test_inputs_bring_the_best_or_every_trial_into_named_folders():
    best = inputs_for("sweep", Take.BEST, [(3, "x-1-3")])
    assert [(d.source, d.path) for d in best] == [("store://jobs/x-1-3/outputs/", "inputs/sweep/")]
    every = inputs_for("sweep", Take.ALL, [(0, "x-1-0"), (2, "x-1-2")])
    assert [d.path for d in every] == ["inputs/sweep/0/", "inputs/sweep/2/"]
    spec = with_inputs(parse_experiment({"name": "train", "command": "t"}), best)
    assert spec.template.data == best


def test_the_cli_draws_the_dag_with_each_node_under_its_parents():
    wf = {"id": "w-1", "name": "wf", "state": "running", "reason": "3 experiments", "nodes": [
        {"name": "sweep", "depends_on": [], "take": "best", "experiment_id": "w-1-0", "state": "completed",
         "reason": "", "best_trial": 2},
        {"name": "prep", "depends_on": [], "take": "best", "experiment_id": "w-1-1", "state": "completed",
         "reason": "", "best_trial": None},
        {"name": "train", "depends_on": ["sweep", "prep"], "take": "best", "experiment_id": None, "state": "waiting",
         "reason": "waiting for sweep, prep", "best_trial": None}]}
    console = Console(width=200, record=True)
    console.print(workflow_tree(wf))
    text = console.export_text()
    lines = text.splitlines()
    assert "w-1 (wf) running" in lines[0]
    assert any("sweep completed w-1-0, best trial 2" in ln for ln in lines)
    assert sum("train waiting" in ln for ln in lines) == 2  # under both parents
    assert "(shown above)" in text and "waiting for sweep, prep" in text

"""Experiment recipes: validation errors name their fields; Hyper's shape is translated or refused by field."""

from __future__ import annotations

import pytest

from trainforge_services.common.contracts.experiments import (
    RecipeKind,
    load_recipe,
    parse_experiment,
    recipe_kind,
)
from trainforge_services.common.contracts.hyper import translate
from trainforge_services.common.errors import InvalidArgument

BASE = {"kind": "experiment", "name": "sweep", "command": "python train.py --lr {{lr}}",
        "parameters": {"lr": [0.1, 0.01]}}


def fields(data: dict) -> dict[str, str]:
    with pytest.raises(InvalidArgument) as e:
        parse_experiment(data)
    return {d["field"]: d["message"] for d in e.value.details}


def test_a_valid_experiment_keeps_the_template_and_the_sweep():
    spec = parse_experiment({**BASE, "samples": 4, "max_parallel": 2, "objective": {"metric": "loss", "goal": "min"},
                             "early_stopping": {"asha": {"min_resource": 1, "reduction_factor": 2}}, "seed": 9})
    assert spec.template.name == "sweep" and spec.samples == 4 and spec.max_parallel == 2
    assert spec.objective.goal.value == "minimize" and spec.early_stopping.asha.reduction_factor == 2
    assert spec.template.params == {"lr": 0.1}  # a representative value; each trial fills its own


@pytest.mark.parametrize(("change", "field"), [
    ({"parameters": {"lr": {"range": "0.3-0.1"}}, "samples": 2}, "parameters.lr"),
    ({"parameters": {"lr": {"range": "fast"}}, "samples": 2}, "parameters.lr.range"),
    ({"parameters": {"lr": {"range": "0-1", "sampling": "log-uniform"}}, "samples": 2}, "parameters.lr"),
    ({"samples": 0}, "samples"),
    ({"max_parallel": 0}, "max_parallel"),
    ({"objective": {"metric": "loss", "goal": "sideways"}}, "objective.goal"),
    ({"early_stopping": {"asha": {"reduction_factor": 1}}, "objective": {"metric": "loss"}},
     "early_stopping.asha.reduction_factor"),
    ({"command": "python train.py --lr {{lr}} --bs {{bs}}"}, "command"),
    ({"resources": {"memory": "lots"}}, "resources.memory"),
    ({"learners": 0}, "learners"),
    ({"mystery": 1}, "mystery"),
])
def test_each_bad_field_is_named(change, field):
    found = fields({**BASE, **change})
    assert any(f == field or f.startswith(field) for f in found), found


def test_a_range_without_samples_and_asha_without_objective_are_refused():
    found = fields({**BASE, "parameters": {"lr": {"range": "0.1-0.3"}}})
    assert any("samples is required" in m for m in found.values())
    found = fields({**BASE, "early_stopping": {"asha": {"min_resource": 1}}})
    assert any("needs an objective" in m for m in found.values())


def test_a_parameter_also_given_as_a_fixed_param_is_refused():
    assert "params.lr" in fields({**BASE, "params": {"lr": 1}})


def test_recipe_kinds():
    assert recipe_kind({"kind": "experiment"}) == RecipeKind.EXPERIMENT
    assert recipe_kind({"name": "a", "command": "x"}) == RecipeKind.JOB
    assert recipe_kind({"experiments": {"a": {}}}) == RecipeKind.EXPERIMENT
    assert recipe_kind({"experiments": {"a": {}, "b": {}}}) == RecipeKind.WORKFLOW
    with pytest.raises(InvalidArgument) as e:
        recipe_kind({"kind": "pipeline"})
    assert e.value.details[0]["field"] == "kind"
    with pytest.raises(InvalidArgument):
        load_recipe("- a list")


HYPER = """
experiments:
  sweep:
    framework: pytorch
    command: python train.py --lr {{lr}} --bs {{bs}}
    samples: 6
    workers: 3
    hardware: 1xgpu
    parameters:
      lr:
        range: 0.1-0.3
        sampling: uniform
      bs: [32, 64]
"""


def test_hypers_recipe_is_translated_with_notes():
    t = translate(load_recipe(HYPER))
    data = t.single()
    assert data["framework"] == "torch" and data["max_parallel"] == 3 and data["resources"] == {"gpus": 1}
    assert any("max_parallel" in n for n in t.notes)
    spec = parse_experiment(data)
    assert spec.samples == 6 and spec.name == "sweep"


def test_hyper_fields_without_equivalent_are_named():
    recipe = load_recipe(HYPER.replace("hardware: 1xgpu", "hardware: p3.2xlarge\n    credentials: aws"))
    with pytest.raises(InvalidArgument) as e:
        translate(recipe)
    found = {d["field"]: d["message"] for d in e.value.details}
    assert "experiments.sweep.hardware" in found and "experiments.sweep.credentials" in found
    assert "no equivalent" in found["experiments.sweep.credentials"]


def test_a_tensorflow_framework_runs_as_a_custom_command():
    t = translate(load_recipe(HYPER.replace("pytorch", "tensorflow")))
    assert t.single()["framework"] == "custom" and any("custom" in n for n in t.notes)

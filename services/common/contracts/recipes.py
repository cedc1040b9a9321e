"""From a recipe's text to a validated experiment: one function for the API (at submit) and the Trainer.

Recognises the recipe's kind (services/common/contracts/experiments.py
`recipe_kind`), translates Hyper's `experiments:` shape
(services/common/contracts/hyper.py), validates the experiment and plans
its trials (services/common/contracts/sampling.py), so a recipe the API
accepted is one the Trainer accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.contracts.experiments import (
    ExperimentSpec,
    RecipeKind,
    load_recipe,
    parse_experiment,
    recipe_kind,
)
from services.common.contracts.hyper import translate
from services.common.contracts.sampling import Trial, plan_trials
from services.common.errors import InvalidArgument


@dataclass(frozen=True)
class PlannedExperiment:
    spec: ExperimentSpec
    trials: list[Trial]
    # what was translated from Hyper's shape, for the user
    notes: list[str]


def experiment_from_recipe(source: str | bytes | dict) -> PlannedExperiment:
    data = load_recipe(source)
    kind = recipe_kind(data)
    if kind == RecipeKind.WORKFLOW:
        raise InvalidArgument("this recipe is a workflow (several experiments); workflows are not served yet: "
                              "submit each experiment on its own",
                              details=[{"field": "experiments", "message": "more than one experiment"}])
    if kind == RecipeKind.JOB:
        raise InvalidArgument("this recipe is a single job (no parameters); submit it to /v1/jobs",
                              details=[{"field": "kind", "message": "not an experiment"}])
    notes: list[str] = []
    if "experiments" in data:
        translation = translate(data)
        data, notes = translation.single(), translation.notes
    spec = parse_experiment(data)
    trials = plan_trials(spec)
    if not trials:
        raise InvalidArgument("the experiment plans no trial",
                              details=[{"field": "parameters", "message": "no trial to run"}])
    return PlannedExperiment(spec, trials, notes)

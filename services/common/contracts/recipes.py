"""From a recipe's text to a validated experiment: one function for the API (at submit) and the Trainer.

Recognises the recipe's kind (services/common/contracts/experiments.py
`recipe_kind`), translates Hyper's `experiments:` shape
(services/common/contracts/hyper.py), validates the experiment and plans
its trials (services/common/contracts/sampling.py), so a recipe the API
accepted is one the Trainer accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainforge_services.common.contracts.experiments import (
    ExperimentSpec,
    RecipeKind,
    load_recipe,
    parse_experiment,
    recipe_kind,
)
from trainforge_services.common.contracts.hyper import translate
from trainforge_services.common.contracts.sampling import Trial, plan_trials, trial_manifest
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import parse_manifest

# an id as long as any experiment's, for checking the trials' manifests before the experiment has one
_SAMPLE_ID = "x-000000000000"


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
        raise InvalidArgument("this recipe is a workflow (several experiments): submit it to /v1/workflows "
                              "(`trainforge submit` does)",
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
    _check_trials(spec, trials)
    return PlannedExperiment(spec, trials, notes)


def _check_trials(spec: ExperimentSpec, trials: list[Trial]) -> None:
    """Every trial's job manifest is valid (the Trainer re-validates each at its submit)."""
    for index, values in enumerate(trials):
        try:
            parse_manifest(trial_manifest(spec, index, values, _SAMPLE_ID).model_dump(mode="json"))
        except InvalidArgument as e:
            raise InvalidArgument(f"trial {index} ({values}) would not be a valid job: {e.message}",
                                  details=e.details) from None

"""Which trials an experiment runs: parameter values drawn from its spec, the same for the same seed.

Pure. Hyper's rule for `samples: n` (mode random): the Cartesian product of
the discrete parameters (k combinations) is sampled n times with minimal
repetition, so every combination appears floor(n/k) or ceil(n/k) times
(the n mod k extra ones chosen at random, without repeats); each continuous
parameter is drawn n times (uniform, log-uniform or integer); the two lists
are matched at random. Grid mode runs every combination once, integer
ranges enumerated; a continuous range has no grid and is refused, naming it.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from trainforge_services.common.contracts.experiments import (
    MAX_TRIALS,
    ExperimentSpec,
    Mode,
    Range,
    Sampling,
    Scalar,
)
from trainforge_services.common.errors import InvalidArgument

Trial = dict[str, Scalar]
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def draw(r: Range, rng: random.Random) -> Scalar:
    lo, hi = r.range
    if r.sampling == Sampling.INTEGER:
        return rng.randint(int(lo), int(hi))
    if r.sampling == Sampling.LOG_UNIFORM:
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return rng.uniform(lo, hi)


def balanced(combinations: Sequence[tuple], n: int, rng: random.Random) -> list[tuple]:
    """n combinations with minimal repetition: each floor(n/k) times, n mod k distinct ones once more; shuffled."""
    k = len(combinations)
    whole, extra = divmod(n, k)
    picked = list(combinations) * whole + rng.sample(list(combinations), extra)
    rng.shuffle(picked)
    return picked


def _grid_values(name: str, spec: list[Scalar] | Range) -> list[Scalar]:
    if isinstance(spec, list):
        return spec
    if spec.sampling == Sampling.INTEGER:
        lo, hi = int(spec.range[0]), int(spec.range[1])
        return list(range(lo, hi + 1))
    raise InvalidArgument(f"parameters.{name}: grid mode needs a list of values or an int range, not a "
                          f"{spec.sampling.value} range", details=[{"field": f"parameters.{name}",
                                                                    "message": "a continuous range has no grid"}])


def _too_many(n: int) -> InvalidArgument:
    return InvalidArgument(f"the experiment would run {n} trials; at most {MAX_TRIALS}",
                           details=[{"field": "samples", "message": f"at most {MAX_TRIALS} trials"}])


def plan_trials(spec: ExperimentSpec) -> list[Trial]:
    """Every trial's parameter values, in trial order; the same spec (and seed) gives the same list."""
    rng = random.Random(spec.seed)
    names = list(spec.parameters)
    if spec.mode == Mode.GRID:
        axes = [_grid_values(n, spec.parameters[n]) for n in names]
        total = math.prod(len(a) for a in axes)
        if total > MAX_TRIALS:
            raise _too_many(total)
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes)]
    discrete = [n for n in names if isinstance(spec.parameters[n], list)]
    continuous = [n for n in names if isinstance(spec.parameters[n], Range)]
    combinations = list(itertools.product(*(spec.parameters[n] for n in discrete)))  # type: ignore[misc]
    n = spec.samples if spec.samples is not None else len(combinations)
    if n > MAX_TRIALS:
        raise _too_many(n)
    chosen = balanced(combinations, n, rng)
    draws = {name: [draw(spec.parameters[name], rng) for _ in range(n)] for name in continuous}  # type: ignore[arg-type]
    trials = []
    for i, combo in enumerate(chosen):
        trial: Trial = dict(zip(discrete, combo, strict=True))
        trial.update({name: draws[name][i] for name in continuous})
        trials.append({name: trial[name] for name in names})
    return trials


def fill(text: str, values: Mapping[str, Any]) -> str:
    """`{{name}}` in `text` replaced by the value (only the names given; others left for the manifest)."""
    def sub(m: re.Match) -> str:
        return str(values[m.group(1)]) if m.group(1) in values else m.group(0)

    return _PLACEHOLDER.sub(sub, text)


def param_env(name: str) -> str:
    """The environment variable a parameter is passed to the learner as (TF_* names are the platform's own,
    never taken from a manifest's env: services/controller/learner.py)."""
    return f"PARAM_{name.upper()}"


def trial_manifest(spec: ExperimentSpec, index: int, values: Mapping[str, Scalar], experiment_id: str) -> Any:
    """Trial `index`'s job manifest: the template with its values filled in, passed as env, and labelled."""
    template = spec.template
    env: dict[str, Any] = {k: fill(v, values) if isinstance(v, str) else v for k, v in template.env.items()}
    env.update({param_env(name): str(value) for name, value in values.items()})
    labels = {**template.labels, "experiment": experiment_id, "trial": str(index)}
    restart = template.restart.model_copy(update={"max_restarts": max(template.restart.max_restarts, spec.retries)})
    suffix = f"-{index}"
    return template.model_copy(update={
        "name": template.name[:63 - len(suffix)].rstrip("-") + suffix,
        "params": {**template.params, **values}, "env": env, "labels": labels, "restart": restart})

"""The experiment recipe: a job template swept over parameters, with an objective and early stopping.

One definition for the API (validation at submit, 422 naming each field),
the Trainer (which stores the validated spec and plans the trials from it)
and the CLI (which recognises the recipe's kind before packing the code).

A recipe is either a `kind: experiment` mapping, which is a job manifest
(services/common/manifest.py) plus the sweep fields below, or Hyper's shape
(`experiments: {name: {framework, parameters, samples, workers, hardware,
command}}`), translated by services/common/contracts/hyper.py. Fields of the
sweep are split off; what is left must be a valid manifest once every
parameter is filled in, so a template error is reported before any trial runs.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import Manifest, field_errors

# the fields of an experiment that are not the job template's
SWEEP_FIELDS = ("kind", "parameters", "samples", "mode", "max_parallel", "prestart", "objective",
                "early_stopping", "retries", "seed")
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RANGE_TEXT = re.compile(r"^\s*(-?\d+(?:\.\d+)?(?:[eE]-?\d+)?)\s*(?:-|\.\.|:)\s*(-?\d+(?:\.\d+)?(?:[eE]-?\d+)?)\s*$")
MAX_TRIALS = 10_000
# trials deployed ahead of a free slot, held before their learners (docs/EXPERIMENTS.md, "Prestarted trials")
DEFAULT_PRESTART = 1
Scalar = str | int | float | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sampling(enum.StrEnum):
    UNIFORM = "uniform"
    LOG_UNIFORM = "log-uniform"
    INTEGER = "int"


class Goal(enum.StrEnum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


class Mode(enum.StrEnum):
    RANDOM = "random"  # Hyper's rule: `samples` draws
    GRID = "grid"  # every combination once


class Range(_Strict):
    """A continuous (or integer) parameter: `range: 0.1-0.3` or `[lo, hi]`, drawn by `sampling`."""

    range: tuple[float, float]
    sampling: Sampling = Sampling.UNIFORM

    @field_validator("range", mode="before")
    @classmethod
    def _range(cls, v: Any) -> Any:
        if isinstance(v, str):
            m = _RANGE_TEXT.match(v)
            if not m:
                raise ValueError(f"{v!r} is not a range; write lo-hi (e.g. 0.1-0.3) or [lo, hi]")
            return (float(m.group(1)), float(m.group(2)))
        return v

    @field_validator("sampling", mode="before")
    @classmethod
    def _sampling(cls, v: Any) -> Any:
        aliases = {"loguniform": "log-uniform", "log_uniform": "log-uniform", "log": "log-uniform",
                   "integer": "int", "randint": "int"}
        return aliases.get(v, v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _bounds(self) -> Range:
        lo, hi = self.range
        if lo >= hi:
            raise ValueError(f"range: the low end {lo:g} must be below the high end {hi:g}")
        if self.sampling == Sampling.LOG_UNIFORM and lo <= 0:
            raise ValueError("range: log-uniform sampling needs a low end above 0")
        if self.sampling == Sampling.INTEGER and (lo != int(lo) or hi != int(hi)):
            raise ValueError("range: int sampling needs whole-number ends")
        return self


class Objective(_Strict):
    metric: str = Field(min_length=1, max_length=100, description="a metric name the trials report")
    goal: Goal = Goal.MINIMIZE

    @field_validator("goal", mode="before")
    @classmethod
    def _goal(cls, v: Any) -> Any:
        return {"min": "minimize", "max": "maximize"}.get(v, v) if isinstance(v, str) else v

    def better(self, a: float, b: float) -> bool:
        return a < b if self.goal == Goal.MINIMIZE else a > b


class Asha(_Strict):
    """Asynchronous successive halving (Li et al., 2018): rungs at min_resource * reduction_factor^k."""

    resource: str = Field("step", min_length=1, description="the metric that counts training progress "
                                                             "(step, epoch, or any increasing metric)")
    min_resource: float = Field(1, gt=0, description="progress at the first rung")
    reduction_factor: int = Field(3, ge=2, le=100, description="eta: one trial in eta is promoted per rung")
    max_resource: float | None = Field(None, gt=0, description="progress of a full trial; no rung at or above it")

    @model_validator(mode="after")
    def _max(self) -> Asha:
        if self.max_resource is not None and self.max_resource <= self.min_resource:
            raise ValueError("max_resource must be above min_resource")
        return self

    def rungs(self, limit: int = 64) -> list[float]:
        out, r = [], self.min_resource
        while len(out) < limit and (self.max_resource is None or r < self.max_resource):
            out.append(r)
            r *= self.reduction_factor
        return out


class EarlyStopping(_Strict):
    asha: Asha


class ExperimentSpec(_Strict):
    """A validated experiment: the job template and how to sweep it."""

    name: str
    template: Manifest
    parameters: dict[str, list[Scalar] | Range] = Field(default_factory=dict)
    samples: int | None = Field(None, ge=1, le=MAX_TRIALS)
    mode: Mode = Mode.RANDOM
    max_parallel: int = Field(1, ge=1, le=1000)
    prestart: int = Field(DEFAULT_PRESTART, ge=0, le=1000,
                          description="trials deployed ahead of a free slot, held before their learners start; "
                                      "each holds its resources in the team's quota while it waits (0: none)")
    objective: Objective | None = None
    early_stopping: EarlyStopping | None = None
    retries: int = Field(0, ge=0, le=100, description="restarts of a failed trial (its job's restart policy)")
    seed: int = Field(0, ge=0, le=2**63 - 1)

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, v: dict[str, list[Scalar] | Range]) -> dict[str, list[Scalar] | Range]:
        for name, spec in v.items():
            if not _PARAM_NAME.match(name):
                raise ValueError(f"{name!r} is not a parameter name: letters, digits and '_', "
                                 "not starting with a digit")
            if isinstance(spec, list) and not spec:
                raise ValueError(f"{name}: a list of values needs at least one value")
        return v

    @model_validator(mode="after")
    def _sweep(self) -> ExperimentSpec:
        if self.prestart > self.max_parallel:
            raise ValueError(f"prestart ({self.prestart}) must not exceed max_parallel ({self.max_parallel}): "
                             "no more trials than that can start at once")
        if self.early_stopping is not None and self.objective is None:
            raise ValueError("early_stopping needs an objective to rank trials by")
        continuous = [n for n, s in self.parameters.items() if isinstance(s, Range)]
        if self.mode == Mode.RANDOM and self.samples is None and continuous:
            raise ValueError(f"samples is required: parameter {continuous[0]} is a range")
        return self


def _split(data: dict) -> tuple[dict, dict]:
    sweep = {k: data[k] for k in SWEEP_FIELDS if k in data and k != "kind"}
    template = {k: v for k, v in data.items() if k not in SWEEP_FIELDS}
    return sweep, template


def _representative(spec: Any) -> Scalar:
    """A value of a parameter, to check that the template is a valid manifest once filled."""
    if isinstance(spec, list) and spec:
        return spec[0]
    if isinstance(spec, dict) and isinstance(spec.get("range"), list | tuple) and spec["range"]:
        return spec["range"][0]
    return 1


def parse_experiment(data: dict) -> ExperimentSpec:
    """A `kind: experiment` mapping (already loaded) -> ExperimentSpec; InvalidArgument naming each bad field."""
    sweep, template = _split(data)
    params = sweep.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidArgument("parameters must be a mapping of name -> values or range",
                              details=[{"field": "parameters", "message": "must be a mapping"}])
    overlap = sorted(set(params) & set(template.get("params") or {}))
    details: list[dict] = [{"field": f"params.{n}", "message": "also a swept parameter; keep one"} for n in overlap]
    sweep["parameters"], bad = _parameters(params)
    details += bad
    filled = {**template, "params": {**(template.get("params") or {}),
                                     **{n: _representative(s) for n, s in params.items()}}}
    try:
        manifest = Manifest.model_validate(filled)
    except ValidationError as e:
        for d in field_errors(e):
            if d["field"] == "manifest" and d["message"].startswith("command uses"):
                d = {"field": "command", "message": d["message"].replace("params does not define",
                                                                      "neither parameters nor params define")}
            details.append(d)
        manifest = None
    try:
        spec = ExperimentSpec.model_validate({**sweep, "name": template.get("name", ""),
                                              "template": manifest or _placeholder()})
    except ValidationError as e:
        details += [d for d in field_errors(e) if not d["field"].startswith("template")]
        spec = None
    if details or spec is None:
        summary = "; ".join(f"{d['field']}: {d['message']}" for d in details)
        raise InvalidArgument(f"invalid experiment: {summary}", details=details)
    # the template's params hold a value of each swept parameter (so it stays a valid manifest when read
    # back); every trial overwrites them with its own
    return spec.model_copy(update={"template": manifest})


def _parameters(params: dict) -> tuple[dict, list[dict]]:
    """Each parameter as a list or a Range, errors named `parameters.<name>[.<field>]` (not by union branch)."""
    out: dict[str, Any] = {}
    details: list[dict] = []
    for name, value in params.items():
        where = f"parameters.{name}"
        if isinstance(value, list):
            bad = [v for v in value if not isinstance(v, str | int | float | bool)]
            if bad:
                details.append({"field": where, "message": f"values must be strings, numbers or booleans, not {bad[0]!r}"})
            out[name] = value
        elif isinstance(value, dict):
            try:
                out[name] = Range.model_validate(value)
            except ValidationError as e:
                details += [{"field": where if d["field"] == "manifest" else f"{where}.{d['field']}",
                             "message": d["message"]} for d in field_errors(e)]
        else:
            details.append({"field": where, "message": "must be a list of values or {range: lo-hi, sampling: ...}"})
    return out, details


def _placeholder() -> Manifest:
    return Manifest(name="placeholder", command="true")


def load_recipe(source: str | bytes | dict) -> dict:
    """YAML/JSON text or a mapping -> the mapping; InvalidArgument for anything else."""
    if isinstance(source, dict):
        return source
    try:
        data = yaml.safe_load(source)
    except yaml.YAMLError as e:
        raise InvalidArgument(f"recipe is not valid YAML or JSON: {e}",
                              details=[{"field": "recipe", "message": str(e)}]) from None
    if not isinstance(data, dict):
        raise InvalidArgument("a recipe must be a mapping of fields",
                              details=[{"field": "recipe", "message": "must be a mapping of fields"}])
    return data


class RecipeKind(enum.StrEnum):
    JOB = "job"
    EXPERIMENT = "experiment"
    WORKFLOW = "workflow"


def recipe_kind(data: dict) -> RecipeKind:
    """What a loaded recipe describes: `kind:` when given, else an `experiments:` mapping, else a job."""
    kind = data.get("kind")
    if kind is None:
        if "experiments" in data:
            experiments = data["experiments"]
            return RecipeKind.WORKFLOW if isinstance(experiments, dict) and len(experiments) > 1 \
                else RecipeKind.EXPERIMENT
        return RecipeKind.EXPERIMENT if "parameters" in data else RecipeKind.JOB
    try:
        return RecipeKind(str(kind).lower())
    except ValueError:
        raise InvalidArgument(f"kind: {kind!r} is not one of job, experiment, workflow",
                              details=[{"field": "kind", "message": "must be job, experiment or workflow"}]) from None


def _experiment_states() -> type[enum.IntEnum]:
    from trainforge_protos import trainer_pb2  # the wire's enum is the one definition

    return enum.IntEnum("ExperimentState", {n: v for n, v in trainer_pb2.ExperimentState.items()})


ExperimentState = _experiment_states()
EXPERIMENT_ENDED = frozenset({ExperimentState.EXPERIMENT_COMPLETED, ExperimentState.EXPERIMENT_FAILED,
                              ExperimentState.EXPERIMENT_CANCELLED})

"""A team's experiments over HTTP: parameter sweeps whose trials are ordinary jobs.

Scoped like jobs: every route takes the caller's team (TenantDep), and
another team's experiment is a 404 exactly like a missing one. The trials
are jobs: their logs, metrics and outputs are read through /v1/jobs/{trial}.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Path, Query, Request, UploadFile
from pydantic import BaseModel, Field, WithJsonSchema

from trainforge_services.api.audit import note_target
from trainforge_services.api.deps import ObjectsDep, SettingsDep, TenantDep
from trainforge_services.api.experiments import ExperimentCalls, submit_experiment
from trainforge_services.api.routes.jobs import CODE_SCHEMA
from trainforge_services.api.schemas import ErrorResponse, error_responses
from trainforge_services.common.contracts import ids

router = APIRouter(prefix="/v1/experiments", tags=["experiments"], responses=error_responses(400, 401, 422, 429))

_NOT_FOUND = {404: {"model": ErrorResponse, "description": "no such experiment in the caller's team"}}
ExperimentId = Annotated[str, Path(description=f"the experiment id, e.g. x-1a2b3c4d5e6f: {ids.RULE}",
                                   max_length=ids.MAX_LEN, pattern=ids.PATTERN)]


class Trial(BaseModel):
    index: int
    job_id: str | None = Field(description="the trial's job (logs, metrics, outputs: /v1/jobs/{job_id}); null "
                                           "until it is submitted")
    state: str = Field(description="the job's state, or not_submitted")
    params: dict[str, Any] = Field(description="the trial's parameter values")
    objective: float | None = Field(description="the last objective value the trial reported")
    stopped_at_rung: int | None = Field(description="ASHA stopped (halted) the trial at this rung")
    rungs: dict[str, float] = Field(description="ASHA: the objective at each rung the trial reached")
    reason: str
    best: bool = Field(description="the experiment's best trial")


class Experiment(BaseModel):
    id: str
    team: str
    name: str
    state: str = Field(description="running, completed, failed, cancelled, halted")
    reason: str
    objective: dict[str, Any] | None = Field(description="{metric, goal}")
    trial_count: int
    best_trial: int | None
    trials: list[Trial] = Field(description="sorted by the objective, best first; empty in a listing")
    spec: dict[str, Any] = Field(description="the validated experiment")
    code_uri: str
    submitted_by: str
    created_at: float
    updated_at: float


class ExperimentList(BaseModel):
    experiments: list[Experiment]


def _calls(request: Request) -> ExperimentCalls:
    return request.app.state.experiments


@router.post("", status_code=201, response_model=Experiment,
             responses={413: {"model": ErrorResponse, "description": "code archive larger than the limit"}},
             summary="Submit an experiment (a parameter sweep)")
def submit(
    tenant: TenantDep, settings: SettingsDep, objects: ObjectsDep, request: Request,
    recipe: Annotated[str, Form(description="the experiment recipe, YAML or JSON: `kind: experiment`, or "
                                            "Hyper's `experiments:` shape with one experiment")],
    code: Annotated[UploadFile | None, File(description="the code folder as a .tar.gz archive"),
                    WithJsonSchema(CODE_SCHEMA)] = None,
) -> dict:
    """Validate the recipe (each problem names its field), store the code once for every trial, and hand the
    experiment to the Trainer, which submits its trials as jobs, at most `max_parallel` at once."""
    exp = submit_experiment(_calls(request), objects, tenant, recipe=recipe,
                            code=code.file if code is not None else None,
                            code_size=code.size if code is not None else None,
                            max_upload_bytes=settings.max_upload_bytes)
    note_target(request, exp["id"])
    return exp


@router.get("", response_model=ExperimentList, summary="The team's experiments, newest first")
def list_experiments(tenant: TenantDep, request: Request,
                     limit: Annotated[int, Query(ge=1, le=1000, description="most experiments returned")] = 50) -> dict:
    return {"experiments": _calls(request).list(tenant.team, limit)}


@router.get("/{experiment_id}", response_model=Experiment, responses=_NOT_FOUND,
            summary="One experiment with its trials, best first")
def get_experiment(tenant: TenantDep, request: Request, experiment_id: ExperimentId) -> dict:
    return _calls(request).get(tenant.team, experiment_id)


_CONFLICT = {409: {"model": ErrorResponse, "description": "the experiment's state does not allow it"}}


@router.post("/{experiment_id}/halt", response_model=Experiment, responses={**_NOT_FOUND, **_CONFLICT},
             summary="Halt an experiment: its running trials checkpoint and stop, no new trial starts")
def halt_experiment(tenant: TenantDep, request: Request, experiment_id: ExperimentId) -> dict:
    return _calls(request).act("halt", tenant.team, experiment_id, tenant.actor)


@router.post("/{experiment_id}/resume", response_model=Experiment, responses={**_NOT_FOUND, **_CONFLICT},
             summary="Resume a halted experiment where it stopped")
def resume_experiment(tenant: TenantDep, request: Request, experiment_id: ExperimentId) -> dict:
    return _calls(request).act("resume", tenant.team, experiment_id, tenant.actor)


@router.post("/{experiment_id}/cancel", response_model=Experiment, responses={**_NOT_FOUND, **_CONFLICT},
             summary="Cancel an experiment and every trial it still runs")
def cancel_experiment(tenant: TenantDep, request: Request, experiment_id: ExperimentId) -> dict:
    return _calls(request).act("cancel", tenant.team, experiment_id, tenant.actor)

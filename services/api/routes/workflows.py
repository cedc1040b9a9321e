"""A team's workflows over HTTP: DAGs of experiments (`kind: workflow`, or Hyper's `experiments:` shape).

Scoped like jobs and experiments: another team's workflow is a 404 exactly
like a missing one. Each node's experiment is read at /v1/experiments/{id}.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Path, Query, Request, UploadFile
from pydantic import BaseModel, Field, WithJsonSchema

from trainforge_services.api.audit import note_target
from trainforge_services.api.deps import ObjectsDep, SettingsDep, TenantDep
from trainforge_services.api.experiments import ExperimentCalls, submit_workflow
from trainforge_services.api.routes.jobs import CODE_SCHEMA
from trainforge_services.api.schemas import ErrorResponse, error_responses
from trainforge_services.common.contracts import ids

router = APIRouter(prefix="/v1/workflows", tags=["workflows"], responses=error_responses(400, 401, 422, 429))

_NOT_FOUND = {404: {"model": ErrorResponse, "description": "no such workflow in the caller's team"}}
WorkflowId = Annotated[str, Path(description=f"the workflow id, e.g. w-1a2b3c4d5e6f: {ids.RULE}",
                                 max_length=ids.MAX_LEN, pattern=ids.PATTERN)]


class Node(BaseModel):
    name: str
    depends_on: list[str]
    take: str = Field(description="best or all: which upstream trials' outputs this node's trials receive")
    experiment_id: str | None = Field(description="the node's experiment; null until it starts")
    state: str = Field(description="waiting, skipped, or its experiment's state")
    reason: str
    best_trial: int | None


class Workflow(BaseModel):
    id: str
    team: str
    name: str
    state: str = Field(description="running, completed, failed, cancelled")
    reason: str
    nodes: list[Node] = Field(description="in a topological order")
    code_uri: str
    submitted_by: str
    created_at: float
    updated_at: float


class WorkflowList(BaseModel):
    workflows: list[Workflow]


def _calls(request: Request) -> ExperimentCalls:
    return request.app.state.experiments


@router.post("", status_code=201, response_model=Workflow,
             responses={413: {"model": ErrorResponse, "description": "code archive larger than the limit"}},
             summary="Submit a workflow (a DAG of experiments)")
def submit(
    tenant: TenantDep, settings: SettingsDep, objects: ObjectsDep, request: Request,
    recipe: Annotated[str, Form(description="the workflow recipe, YAML or JSON")],
    code: Annotated[UploadFile | None, File(description="the code folder as a .tar.gz archive"),
                    WithJsonSchema(CODE_SCHEMA)] = None,
) -> dict:
    """Validate the DAG (no cycles; unknown names and bad fields named), store the code once for every node,
    and hand it to the Trainer, which starts each experiment once those it depends on completed."""
    wf = submit_workflow(_calls(request), objects, tenant, recipe=recipe, code=code.file if code is not None else None,
                         code_size=code.size if code is not None else None, max_upload_bytes=settings.max_upload_bytes)
    note_target(request, wf["id"])
    return wf


@router.get("", response_model=WorkflowList, summary="The team's workflows, newest first")
def list_workflows(tenant: TenantDep, request: Request,
                   limit: Annotated[int, Query(ge=1, le=1000, description="most workflows returned")] = 50) -> dict:
    return {"workflows": _calls(request).list_workflows(tenant.team, limit)}


@router.get("/{workflow_id}", response_model=Workflow, responses=_NOT_FOUND, summary="One workflow and its nodes")
def get_workflow(tenant: TenantDep, request: Request, workflow_id: WorkflowId) -> dict:
    return _calls(request).get_workflow(tenant.team, workflow_id)


@router.post("/{workflow_id}/cancel", response_model=Workflow,
             responses={**_NOT_FOUND, 409: {"model": ErrorResponse, "description": "the workflow already ended"}},
             summary="Cancel a workflow and the experiment it runs")
def cancel_workflow(tenant: TenantDep, request: Request, workflow_id: WorkflowId) -> dict:
    return _calls(request).cancel_workflow(tenant.team, workflow_id, tenant.actor)

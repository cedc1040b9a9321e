"""The routes every run of many jobs has, at /v1/<plural>: submit (recipe + code), list, one run, its actions.

Scoped like jobs: every route takes the caller's team (TenantDep), and
another team's run is a 404 exactly like a missing one. `RunRoutes` makes a
kind's router; routes/experiments.py and routes/workflows.py give it their
models, words and actions. (No `from __future__ import annotations` here:
FastAPI reads the routes' annotations, which are made per kind.)
"""

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Path, Query, Request, UploadFile
from pydantic import BaseModel, Field, WithJsonSchema, create_model

from trainforge_services.api.audit import note_target
from trainforge_services.api.deps import ObjectsDep, SettingsDep, TenantDep
from trainforge_services.api.experiments import RunCalls, submit_run
from trainforge_services.api.routes.jobs import CODE_SCHEMA
from trainforge_services.api.schemas import ErrorResponse, error_responses
from trainforge_services.common.contracts import ids

Code = Annotated[UploadFile | None, File(description="the code folder as a .tar.gz archive"),
                 WithJsonSchema(CODE_SCHEMA)]
_TOO_LARGE = {413: {"model": ErrorResponse, "description": "code archive larger than the limit"}}


def run_model(name: str, *, states: str, **own: Any) -> type[BaseModel]:
    """A kind's REST model: the fields every run has, in the order it answers them, with its `own` fields
    (as `pydantic.create_model` takes them) after `reason`; `states` says which states it can be in."""
    return create_model(name, id=str, team=str, name=str, state=(str, Field(description=states)), reason=str, **own,
                        code_uri=str, submitted_by=str, created_at=float, updated_at=float)


class RunRoutes:
    """One kind's router (`.router`) answering `model`; `noun` names its id (`<noun>_id`), `plural` its path,
    tag and listing (`<Model>List`)."""

    def __init__(self, noun: str, plural: str, *, model: type[BaseModel], example: str):
        self.router = APIRouter(prefix=f"/v1/{plural}", tags=[plural], responses=error_responses(400, 401, 422, 429))
        self._noun, self._plural = noun, plural
        self._model = model
        self._list_model = create_model(f"{model.__name__}List", **{plural: list[model]})  # type: ignore[valid-type]
        self._path = f"/{{{noun}_id}}"
        self.not_found = {404: {"model": ErrorResponse, "description": f"no such {noun} in the caller's team"}}
        self.run_id = Annotated[str, Path(alias=f"{noun}_id", description=f"the {noun} id, e.g. {example}: {ids.RULE}",
                                          max_length=ids.MAX_LEN, pattern=ids.PATTERN)]

    def calls(self, request: Request) -> RunCalls:
        return getattr(request.app.state.experiments, self._plural)

    def submit(self, *, summary: str, recipe: str, doc: str) -> None:
        """POST /v1/<plural>: the recipe (described by `recipe`) and its code, answered 201 with the new run."""
        Recipe = Annotated[str, Form(description=recipe)]  # noqa: N806 - a type, made per kind

        def submit(tenant: TenantDep, settings: SettingsDep, objects: ObjectsDep, request: Request, recipe: Recipe,
                   code: Code = None) -> dict:
            run = submit_run(self.calls(request), objects, tenant, recipe=recipe,
                             code=code.file if code is not None else None,
                             code_size=code.size if code is not None else None,
                             max_upload_bytes=settings.max_upload_bytes)
            note_target(request, run["id"])
            return run

        submit.__doc__ = doc
        self.router.add_api_route("", submit, methods=["POST"], status_code=201, response_model=self._model,
                                  responses=_TOO_LARGE, summary=summary)

    def listing(self, *, summary: str) -> None:
        """GET /v1/<plural>: the team's runs, `{<plural>: [...]}`."""
        Limit = Annotated[int, Query(ge=1, le=1000, description=f"most {self._plural} returned")]  # noqa: N806

        def listing(tenant: TenantDep, request: Request, limit: Limit = 50) -> dict:
            return {self._plural: self.calls(request).list(tenant.team, limit)}

        self.router.add_api_route("", listing, methods=["GET"], response_model=self._list_model, summary=summary,
                                  name=f"list_{self._plural}")

    def one(self, *, summary: str) -> None:
        """GET /v1/<plural>/{<noun>_id}: one run."""
        def one(tenant: TenantDep, request: Request, run_id: self.run_id) -> dict:  # type: ignore[name-defined]
            return self.calls(request).get(tenant.team, run_id)

        self.router.add_api_route(self._path, one, methods=["GET"], response_model=self._model,
                                  responses=self.not_found, summary=summary, name=f"get_{self._noun}")

    def action(self, action: str, *, summary: str, conflict: str) -> None:
        """POST /v1/<plural>/{<noun>_id}/<action>: the run after it; 409 (`conflict`) where its state refuses."""
        def act(tenant: TenantDep, request: Request, run_id: self.run_id) -> dict:  # type: ignore[name-defined]
            return self.calls(request).act(action, tenant.team, run_id, tenant.actor)

        responses: dict[int | str, dict[str, Any]] = {
            **self.not_found, 409: {"model": ErrorResponse, "description": conflict}}
        self.router.add_api_route(f"{self._path}/{action}", act, methods=["POST"], response_model=self._model,
                                  responses=responses, summary=summary, name=f"{action}_{self._noun}")

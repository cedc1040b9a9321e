"""/v1/team/secrets and /v1/admin/teams/{team}/secrets: team secrets, write-only.

Team admins set, list and delete their team's secrets; platform admins do
the same for any team. A value goes in (in the request body, never the path
or query, so the audit log - which records paths - never sees it) and never
comes out: every response carries the secret's name and times only. A job
uses one through its manifest, `env: {VAR: {secret: name}}`, and only the
learner's environment ever holds the value (services/common/secrets.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from trainforge_services.api.audit import note_target
from trainforge_services.api.deps import IdentityDep, PlatformAdminDep, TeamAdminDep
from trainforge_services.api.schemas import error_responses
from trainforge_services.common.manifest import SECRET_NAME_RULE
from trainforge_services.common.secrets import MAX_VALUE_BYTES, SecretBox, SecretStore, load_key

router = APIRouter(tags=["secrets"], responses=error_responses(400, 401, 403, 422, 429))

SecretName = Annotated[str, Path(description=f"the secret's name: {SECRET_NAME_RULE}",
                                 pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
TeamName = Annotated[str, Path(description="the team's name", max_length=63)]


def _secrets(request: Request) -> SecretStore:
    state = request.app.state
    if state.secrets is None:
        # made on first use: building the app touches no database, and in dev mode the key file is
        # written only once a secret is used (two requests racing here build two equal stores)
        settings = state.settings
        state.secrets = SecretStore(state.identity.db, lambda: SecretBox(load_key(
            settings.secrets_key, dev_mode=settings.dev_mode, state_dir=settings.state_dir)))
    return state.secrets


SecretsDep = Annotated[SecretStore, Depends(_secrets)]


class SecretIn(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    value: str = Field(min_length=1, max_length=MAX_VALUE_BYTES, description="the secret's value; never shown again")


class Secret(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    team: str
    created_at: float | None = None
    updated_at: float | None = None
    updated_by: str = Field("", description="the key id that set it last")


class SecretList(BaseModel):
    model_config = ConfigDict(frozen=True)
    secrets: list[Secret]


_NO_SECRET = error_responses(404, e404="no such secret")


@router.get("/v1/team/secrets", response_model=SecretList, summary="The team's secrets (names only)")
def list_team_secrets(tenant: TeamAdminDep, secrets: SecretsDep) -> dict:
    return {"secrets": secrets.list(tenant.team)}


@router.put("/v1/team/secrets/{name}", response_model=Secret, summary="Set one of the team's secrets")
def set_team_secret(tenant: TeamAdminDep, secrets: SecretsDep, name: SecretName, body: SecretIn,
                    request: Request) -> dict:
    """Creates or replaces it; jobs deployed from now on get the new value. The value is never returned."""
    note_target(request, name)
    return secrets.put(tenant.team, name, body.value, actor=tenant.key_id)


@router.delete("/v1/team/secrets/{name}", response_model=Secret, responses=_NO_SECRET,
               summary="Delete one of the team's secrets")
def delete_team_secret(tenant: TeamAdminDep, secrets: SecretsDep, name: SecretName, request: Request) -> dict:
    note_target(request, name)
    return secrets.delete(tenant.team, name)


@router.get("/v1/admin/teams/{team}/secrets", response_model=SecretList,
            responses=error_responses(404, e404="no such team"), summary="A team's secrets (names only)")
def list_secrets(_: PlatformAdminDep, identity: IdentityDep, secrets: SecretsDep, team: TeamName) -> dict:
    identity.team(team)
    return {"secrets": secrets.list(team)}


@router.put("/v1/admin/teams/{team}/secrets/{name}", response_model=Secret,
            responses=error_responses(404, e404="no such team"), summary="Set a secret of any team")
def set_secret(tenant: PlatformAdminDep, identity: IdentityDep, secrets: SecretsDep, team: TeamName,
               name: SecretName, body: SecretIn, request: Request) -> dict:
    identity.team(team)
    note_target(request, name, team=team)
    return secrets.put(team, name, body.value, actor=tenant.key_id)


@router.delete("/v1/admin/teams/{team}/secrets/{name}", response_model=Secret,
               responses=error_responses(404, e404="no such team or secret"), summary="Delete a secret of any team")
def delete_secret(_: PlatformAdminDep, secrets: SecretsDep, team: TeamName, name: SecretName,
                  request: Request) -> dict:
    note_target(request, name, team=team)
    return secrets.delete(team, name)

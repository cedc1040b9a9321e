"""/v1/team: the caller's own team — its quota and usage (everyone), its keys (team admins).

Everything here is scoped by the caller's team: another team's key id is
answered 404 exactly like a missing one.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from trainforge_services.api import access
from trainforge_services.api.audit import note_target
from trainforge_services.api.deps import IdentityDep, TeamAdminDep, TenantDep, TrainerDep
from trainforge_services.api.schemas import error_responses
from trainforge_services.api.schemas_quota import TeamUsage
from trainforge_services.api.schemas_teams import ApiKey, IssuedKey, KeyIn, KeyList, PublicationList

router = APIRouter(prefix="/v1/team", tags=["team"], responses=error_responses(400, 401, 422, 429))

KeyId = Annotated[str, Path(description="the key's id, e.g. 1a2b3c4d", max_length=64)]
_ADMIN = error_responses(403)


@router.get("/usage", response_model=TeamUsage, summary="The team's quota, what it holds now, its queue")
def team_usage(tenant: TenantDep, trainer: TrainerDep) -> dict:
    return trainer.team_usage(tenant.team)


@router.get("/published", response_model=PublicationList,
            summary="Object-store prefixes published to the team, which its jobs may read")
def published(tenant: TenantDep, trainer: TrainerDep) -> dict:
    """Besides these, a job reads only its team's own objects (store://jobs/<id>/ of its jobs,
    store://experiments/<id>/ of its experiments and workflows). Other teams are not named."""
    mine = []
    for p in trainer.publications():
        if "*" in p["teams"] or tenant.team in p["teams"]:
            mine.append({"prefix": p["prefix"], "teams": ["*"] if "*" in p["teams"] else [tenant.team]})
    return {"publications": mine}


@router.get("/keys", response_model=KeyList, responses=_ADMIN, summary="The team's API keys (never their secrets)")
def list_keys(tenant: TeamAdminDep, identity: IdentityDep) -> dict:
    return {"keys": identity.list_keys(tenant.team)}


@router.post("/keys", status_code=201, response_model=IssuedKey, responses={**_ADMIN, **error_responses(409)},
             summary="Issue an API key for the team")
def issue_key(tenant: TeamAdminDep, identity: IdentityDep, body: KeyIn, request: Request) -> dict:
    """The response carries the key itself, once; the platform keeps only its hash. A key's role
    can be no higher than the caller's."""
    issued = access.issue_key(identity, tenant, tenant.team, body)
    note_target(request, issued["key_id"])
    return issued


@router.delete("/keys/{key_id}", response_model=ApiKey, responses={**_ADMIN, **error_responses(404)},
               summary="Revoke one of the team's keys")
def revoke_key(tenant: TeamAdminDep, identity: IdentityDep, key_id: KeyId) -> dict:
    """Effective from the next request, for the key and every token exchanged for it. A key of a
    higher role than the caller's cannot be revoked here."""
    return access.revoke_key(identity, tenant, tenant.team, key_id)

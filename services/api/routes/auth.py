"""/v1/auth: who am I, and a short-lived token for dashboard sessions in exchange for an API key."""

from __future__ import annotations

from fastapi import APIRouter

from trainforge_services.api.deps import IdentityDep, TenantDep, TokensDep
from trainforge_services.api.schemas import error_responses
from trainforge_services.api.schemas_teams import Token, Whoami
from trainforge_services.common.errors import PermissionDenied

router = APIRouter(prefix="/v1/auth", tags=["auth"], responses=error_responses(401, 429))


@router.get("/me", response_model=Whoami, summary="The caller: team, key id, role")
def whoami(tenant: TenantDep) -> dict:
    return {"team": tenant.team, "key_id": tenant.key_id, "role": tenant.role.value, "via": tenant.via}


@router.post("/token", response_model=Token, summary="Exchange an API key for a short-lived JWT",
             responses=error_responses(403, e403="a token cannot be exchanged for another token"))
def issue_token(tenant: TenantDep, tokens: TokensDep, identity: IdentityDep) -> dict:
    """A JWT with the key's id (`sub`), team and role, valid for the configured lifetime and never
    past the key's own expiry. Revoking the key (or disabling its team) ends its tokens too."""
    if tenant.via != "key":
        raise PermissionDenied("only an API key can be exchanged for a token, not another token")
    claims = tokens.issue(tenant, key_expires_at=identity.key_expiry(tenant.key_id))
    return {"token": tokens.encode(claims), "token_type": "bearer", "expires_at": float(int(claims.expires_at)),
            "expires_in": max(0, int(claims.expires_at - claims.issued_at))}

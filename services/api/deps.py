"""Request dependencies, named once as `Annotated` aliases so routes read like their signature.

The app factory puts the collaborators on `app.state`; these aliases fetch
them per request, which is what lets tests inject their own.

Authentication and authorization live here too. `TenantDep` is any
authenticated caller (an API key, `tf_...`, or a JWT from POST
/v1/auth/token, or the dashboard's session cookie with its CSRF header on
state-changing requests: services/api/ui/session.py), counted against its key's rate limit and remembered on
the request for the audit log. `TeamAdminDep` and `PlatformAdminDep` add a
role check that answers 403; a route states the role it needs by which of
the three it takes, and the app factory publishes that role in the OpenAPI
spec as `x-required-role` (and refuses to build a /v1 route that takes none).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trainforge_services.api.audit import AuditLog
from trainforge_services.api.identity import KEY_PREFIX, IdentityStore, Role, Tenant
from trainforge_services.api.ratelimit import RateLimiter
from trainforge_services.api.tokens import TokenCodec
from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.api.ui import session as ui_session
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.errors import PermissionDenied, Unauthenticated
from trainforge_services.common.settings import ApiSettings

_bearer = HTTPBearer(auto_error=False, scheme_name="Bearer",
                     description="An API key (`tf_<id>_<secret>`) or a token from POST /v1/auth/token: "
                                 "`Authorization: Bearer <key or token>`")


def _settings(request: Request) -> ApiSettings:
    return request.app.state.settings


def _trainer(request: Request) -> TrainerApi:
    return request.app.state.trainer


def _identity(request: Request) -> IdentityStore:
    return request.app.state.identity


def _logs(request: Request) -> LogStore:
    return request.app.state.logs


def _objects(request: Request) -> ObjectStore:
    return request.app.state.objects


def _tokens(request: Request) -> TokenCodec:
    return request.app.state.tokens


def _limiter(request: Request) -> RateLimiter:
    return request.app.state.limiter


def _audit(request: Request) -> AuditLog:
    return request.app.state.audit


SettingsDep = Annotated[ApiSettings, Depends(_settings)]
TrainerDep = Annotated[TrainerApi, Depends(_trainer)]
IdentityDep = Annotated[IdentityStore, Depends(_identity)]
LogsDep = Annotated[LogStore, Depends(_logs)]
ObjectsDep = Annotated[ObjectStore, Depends(_objects)]
TokensDep = Annotated[TokenCodec, Depends(_tokens)]
AuditDep = Annotated[AuditLog, Depends(_audit)]


def authenticate(credential: str, identity: IdentityStore, tokens: TokenCodec) -> Tenant:
    """The caller behind a bearer credential, checked by the identity store (a success reused ≤ 1 s)."""
    if credential.startswith(KEY_PREFIX):
        return identity.authenticate(credential)
    claims = tokens.verify(credential)
    tenant = identity.tenant_of(claims.key_id, via="jwt")
    if (tenant.team, tenant.role) != (claims.team, claims.role):
        raise Unauthenticated("invalid token: it does not match its API key")
    return tenant


def _tenant(request: Request, identity: IdentityDep, tokens: TokensDep,
            limiter: Annotated[RateLimiter, Depends(_limiter)],
            creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Tenant:
    if creds is not None and creds.credentials:
        tenant = authenticate(creds.credentials, identity, tokens)
    elif session := request.cookies.get(ui_session.SESSION_COOKIE):
        # the dashboard's session cookie: a JWT; a state-changing request must prove it came from our page
        tenant = authenticate(session, identity, tokens)
        request.state.tenant = tenant
        if request.method not in ui_session.SAFE_METHODS:
            ui_session.check_csrf(request.app.state.settings.jwt_secret, session,
                                  request.headers.get(ui_session.CSRF_HEADER))
    else:
        raise Unauthenticated("missing credentials; send `Authorization: Bearer <API key or token>`")
    request.state.tenant = tenant
    limiter.check(tenant.key_id)
    return tenant


TenantDep = Annotated[Tenant, Depends(_tenant)]


def _team_admin(tenant: TenantDep) -> Tenant:
    if not tenant.role.at_least(Role.TEAM_ADMIN):
        raise PermissionDenied("this needs a team_admin or platform_admin key")
    return tenant


def _platform_admin(tenant: TenantDep) -> Tenant:
    if not tenant.role.at_least(Role.PLATFORM_ADMIN):
        raise PermissionDenied("this needs a platform_admin key")
    return tenant


TeamAdminDep = Annotated[Tenant, Depends(_team_admin)]
PlatformAdminDep = Annotated[Tenant, Depends(_platform_admin)]

# The dependency callables above and the role each one demands, for the app factory.
REQUIRED_ROLE = {_tenant: Role.MEMBER, _team_admin: Role.TEAM_ADMIN, _platform_admin: Role.PLATFORM_ADMIN}

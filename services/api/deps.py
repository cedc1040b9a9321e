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

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from trainforge_services.api.audit import AuditLog
from trainforge_services.api.identity import KEY_PREFIX, IdentityStore, Role, Tenant
from trainforge_services.api.ratelimit import RateLimiter
from trainforge_services.api.tokens import Claims, TokenCodec
from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.api.ui import session as ui_session
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.destinations import WebhookPolicy
from trainforge_services.common.errors import PermissionDenied, Unauthenticated
from trainforge_services.common.settings import ApiSettings

_bearer = HTTPBearer(auto_error=False, scheme_name="Bearer",
                     description="An API key (`tf_<id>_<secret>`) or a token from POST /v1/auth/token: "
                                 "`Authorization: Bearer <key or token>`")


# A collaborator's getter is `async def` although it only reads app.state: FastAPI runs a plain `def`
# dependency in the thread pool, a hop per getter per request (the largest cost of a cached GET).
def _state(name: str) -> Callable[[Request], Awaitable[Any]]:
    """A dependency that answers `request.app.state.<name>`, the collaborator the app factory put there."""

    async def get(request: Request) -> Any:
        return getattr(request.app.state, name)

    get.__name__ = get.__qualname__ = f"_{name}"
    return get


_limiter = _state("limiter")

SettingsDep = Annotated[ApiSettings, Depends(_state("settings"))]
TrainerDep = Annotated[TrainerApi, Depends(_state("trainer"))]
IdentityDep = Annotated[IdentityStore, Depends(_state("identity"))]
LogsDep = Annotated[LogStore, Depends(_state("logs"))]
ObjectsDep = Annotated[ObjectStore, Depends(_state("objects"))]
TokensDep = Annotated[TokenCodec, Depends(_state("tokens"))]
AuditDep = Annotated[AuditLog, Depends(_state("audit"))]
WebhookPolicyDep = Annotated[WebhookPolicy, Depends(_state("webhook_policy"))]


def authenticate(credential: str, identity: IdentityStore, tokens: TokenCodec) -> Tenant:
    """The caller behind a bearer credential, checked by the identity store (a success reused ≤ 1 s)."""
    if credential.startswith(KEY_PREFIX):
        return identity.authenticate(credential)
    claims = tokens.verify(credential)
    return _matching(identity.tenant_of(claims.key_id, via="jwt"), claims)


def authenticate_cached(credential: str, identity: IdentityStore, tokens: TokenCodec) -> Tenant | None:
    """`authenticate` without touching the store: its answer when the identity store's cache holds the key's
    last full check, None when only the store can tell. A token's signature and claims are verified either way."""
    if credential.startswith(KEY_PREFIX):
        return identity.cached(credential)
    claims = tokens.verify(credential)
    tenant = identity.cached_tenant_of(claims.key_id, via="jwt")
    return None if tenant is None else _matching(tenant, claims)


def _matching(tenant: Tenant, claims: Claims) -> Tenant:
    if (tenant.team, tenant.role) != (claims.team, claims.role):
        raise Unauthenticated("invalid token: it does not match its API key")
    return tenant


def _caller(request: Request, identity: IdentityStore, tokens: TokenCodec,
            creds: HTTPAuthorizationCredentials | None, check: Callable[..., Tenant | None]) -> Tenant | None:
    """Who sends the request, by `check` (`authenticate`, or `authenticate_cached`: None when it cannot tell)."""
    if creds is not None and creds.credentials:
        tenant = check(creds.credentials, identity, tokens)
    elif session := request.cookies.get(ui_session.SESSION_COOKIE):
        # the dashboard's session cookie: a JWT; a state-changing request must prove it came from our page
        tenant = check(session, identity, tokens)
        if tenant is None:
            return None
        request.state.tenant = tenant
        if request.method not in ui_session.SAFE_METHODS:
            ui_session.check_csrf(request.app.state.settings.jwt_secret, session,
                                  request.headers.get(ui_session.CSRF_HEADER))
    else:
        raise Unauthenticated("missing credentials; send `Authorization: Bearer <API key or token>`")
    return tenant


async def _tenant(request: Request, identity: IdentityDep, tokens: TokensDep,
                  limiter: Annotated[RateLimiter, Depends(_limiter)],
                  creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Tenant:
    # On the event loop when the answer is in the auth cache (hashing, a dict read, a token's signature);
    # in the thread pool when the store must be read. Both are the same check (`_caller`).
    tenant = _caller(request, identity, tokens, creds, authenticate_cached)
    if tenant is None:
        tenant = await run_in_threadpool(_caller, request, identity, tokens, creds, authenticate)
    request.state.tenant = tenant
    if limiter.blocking:  # the shared limiter reads and writes the store
        await run_in_threadpool(limiter.check, tenant.key_id)
    else:
        limiter.check(tenant.key_id)
    return tenant


TenantDep = Annotated[Tenant, Depends(_tenant)]


async def _team_admin(tenant: TenantDep) -> Tenant:
    if not tenant.role.at_least(Role.TEAM_ADMIN):
        raise PermissionDenied("this needs a team_admin or platform_admin key")
    return tenant


async def _platform_admin(tenant: TenantDep) -> Tenant:
    if not tenant.role.at_least(Role.PLATFORM_ADMIN):
        raise PermissionDenied("this needs a platform_admin key")
    return tenant


TeamAdminDep = Annotated[Tenant, Depends(_team_admin)]
PlatformAdminDep = Annotated[Tenant, Depends(_platform_admin)]

# The dependency callables above and the role each one demands, for the app factory.
REQUIRED_ROLE = {_tenant: Role.MEMBER, _team_admin: Role.TEAM_ADMIN, _platform_admin: Role.PLATFORM_ADMIN}

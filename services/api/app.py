"""The API's app factory: the one place collaborators are wired and errors become HTTP.

`create_app` builds everything from settings unless a collaborator is
handed in, so tests run the real routes against twins. Every failure leaves
the app in one body shape, `{"error": {"code", "message", "details"}}`:
domain errors (trainforge_services.common.errors) carry their own status and code,
request validation lists every bad field, and anything unexpected is logged
here and answered with a bare 500.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainforge_services.api import prom, retention, ui
from trainforge_services.api.audit import AuditLog, AuditMiddleware, note_refused, refusals_of
from trainforge_services.api.deps import REQUIRED_ROLE
from trainforge_services.api.experiments import ExperimentCalls
from trainforge_services.api.gateway import JobGateway
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.api.jobcache import CachingTrainer
from trainforge_services.api.ratelimit import RateLimiter
from trainforge_services.api.ratelimit_shared import SharedRateLimiter
from trainforge_services.api.routes import admin as admin_routes
from trainforge_services.api.routes import admin_jobs as admin_job_routes
from trainforge_services.api.routes import auth as auth_routes
from trainforge_services.api.routes import experiments as experiment_routes
from trainforge_services.api.routes import gateway as gateway_routes
from trainforge_services.api.routes import health as health_routes
from trainforge_services.api.routes import jobs as job_routes
from trainforge_services.api.routes import notifications as notification_routes
from trainforge_services.api.routes import observe as observe_routes
from trainforge_services.api.routes import outputs as output_routes
from trainforge_services.api.routes import retention as retention_routes
from trainforge_services.api.routes import secrets as secret_routes
from trainforge_services.api.routes import team as team_routes
from trainforge_services.api.routes import workflows as workflow_routes
from trainforge_services.api.tokens import TokenCodec
from trainforge_services.api.trainer_client import TrainerApi, TrainerClient
from trainforge_services.common import destinations, jobcreds, rpcauth
from trainforge_services.common.adapters import mongo
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.objectstore import ObjectStore, store_from_settings
from trainforge_services.common.errors import TrainforgeError, Unavailable
from trainforge_services.common.secrets import SecretStore, load_key
from trainforge_services.common.settings import ApiSettings

log = logging.getLogger(__name__)

# Room for the manifest and the multipart framing on top of the code archive.
_FORM_ALLOWANCE = 1 << 20

_HTTP_CODES = {400: "bad_request", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 413: "payload_too_large",
               415: "unsupported_media_type", 429: "resource_exhausted"}

_LOCATIONS = {"body", "query", "path", "header", "cookie"}

DESCRIPTION = """\
Submit, follow and cancel training jobs of your team; manage teams, keys and quotas.

Authenticate with an API key, `Authorization: Bearer tf_<id>_<secret>`, or with a short-lived
token from `POST /v1/auth/token` (`Authorization: Bearer <jwt>`). `trainforge up` creates the
first key of the embedded stack, `trainforge admin bootstrap` the first platform admin's; team
admins issue more under `/v1/team/keys`, platform admins under `/v1/admin`.

Roles: `member` (the team's jobs and usage), `team_admin` (also the team's keys),
`platform_admin` (also every team, quotas, usage and the audit log). Each operation names the
role it needs in `x-required-role`; a weaker key gets 403. Everything is scoped by the caller's
team: another team's job or key is answered 404 exactly like a missing one. A revoked or expired
key, a token whose key was revoked, and any key of a disabled team get 401. Each key may make a
limited number of requests per second; over it, 429 with `Retry-After`. Every POST, PUT, PATCH
and DELETE is written to the audit log.

Errors always have the body `{"error": {"code", "message", "details": [{"field", "message"}]}}`;
`details` names every bad field of a rejected request.
"""


def error_response(status: int, code: str, message: str, details: list[dict] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "details": details or []}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _domain_error(request: Request, exc: TrainforgeError) -> JSONResponse:
    note_refused(request, refusals_of(exc))
    headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else getattr(exc, "headers", None)
    if exc.http_status >= 500:
        log.warning("%s: %s", exc.code, exc.message)
    return error_response(exc.http_status, exc.code, exc.message, exc.details, headers)


def _field(loc: tuple | list) -> str:
    parts = [str(p) for p in loc if p != "[key]"]  # a bad dict key: name the key itself
    if len(parts) > 1 and parts[0] in _LOCATIONS:
        parts = parts[1:]
    return ".".join(parts) or "request"


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    details = [{"field": _field(err.get("loc", ())), "message": err.get("msg", "invalid")} for err in exc.errors()]
    summary = "; ".join(f"{d['field']}: {d['message']}" for d in details)
    return error_response(422, "invalid_argument", f"invalid request: {summary}", details)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = _HTTP_CODES.get(exc.status_code, "internal" if exc.status_code >= 500 else "bad_request")
    headers = exc.headers
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
    return error_response(exc.status_code, code, str(exc.detail), headers=headers)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route offers at this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches({**request.scope, "method": ""})
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


class _CatchAll:
    """Answer an unexpected exception with a bare 500 and log it once, here.

    Starlette's own fallback re-raises after answering, which prints the
    traceback a second time from the server; this sits inside it.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await error_response(500, "internal", "internal error")(scope, receive, send)


class _UploadLimit:
    """Refuse a request whose declared body is over the limit before reading any of it."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.max_bytes:
                msg = f"request body of {int(length)} bytes is over the limit of {self.max_bytes}"
                await error_response(413, "payload_too_large", msg,
                                     [{"field": "code", "message": msg}])(scope, receive, send)
                return
        await self.app(scope, receive, send)


def required_role(dependant: Dependant) -> Role | None:
    """The strongest role a route's dependencies demand (trainforge_services.api.deps.REQUIRED_ROLE), if any."""
    roles = [REQUIRED_ROLE[d.call] for d in _walk(dependant) if d.call in REQUIRED_ROLE]
    return max(roles, key=lambda r: r.rank) if roles else None


def _walk(dependant: Dependant) -> list[Dependant]:
    out = []
    for d in dependant.dependencies:
        out.append(d)
        out.extend(_walk(d))
    return out


def _publish_roles(router: APIRouter) -> APIRouter:
    """Mark each operation with the role it needs; a /v1 route that authenticates nobody is a bug."""
    for route in router.routes:
        if not isinstance(route, APIRoute):
            continue
        role = required_role(route.dependant)
        if role is None:
            if route.path.startswith("/v1/"):
                raise RuntimeError(f"route {route.path} does not authenticate its caller; take TenantDep, "
                                   "TeamAdminDep or PlatformAdminDep")
            continue
        route.openapi_extra = {**(route.openapi_extra or {}), "x-required-role": role.value}
    return router


def _create_log_index(logs: LogStore) -> None:
    """Create the log index at start, off the request path (idempotent; best effort).

    Otherwise the first learner's log shipper creates it, and its job waits for that before it completes:
    0.8 s on the embedded log store (the first job of a fresh stack in bench/submit_latency.py).
    """
    try:
        logs.ensure_index()
    except Unavailable as e:
        log.info("the log index was not created at start (the first learner's log shipper will): %s", e.message)


def _gateway(settings: ApiSettings, trainer: TrainerApi, objects: ObjectStore, logs: LogStore,
             owned: list[Callable[[], Any]]) -> JobGateway | None:
    """The job gateway, with the credentials key (dev mode: the stack's generated one); None without one."""
    if not settings.credentials_key and not settings.dev_mode:
        log.warning("no credentials_key (TF_CREDENTIALS_KEY): the job gateway is off; controllers need the "
                    "platform's store credentials")
        return None
    gateway = JobGateway(lambda: jobcreds.load_key(settings.credentials_key, dev_mode=settings.dev_mode,
                                                   state_dir=settings.state_dir), trainer, objects, logs)
    owned.append(gateway.close)
    return gateway


def create_app(settings: ApiSettings, *, trainer: TrainerApi | None = None, identity: IdentityStore | None = None,
               logs: LogStore | None = None, objects: ObjectStore | None = None, audit: AuditLog | None = None,
               limiter: RateLimiter | None = None, secrets: SecretStore | None = None,
               experiments: ExperimentCalls | None = None) -> FastAPI:
    """The REST API; collaborators not given are built from settings and closed at shutdown.

    Raises ValueError for settings it cannot serve with (an unsupported JWT algorithm or a
    signing secret too short for it, no secrets key outside dev mode).
    """
    tokens = TokenCodec.from_settings(settings)
    if secrets is None and not settings.dev_mode:
        load_key(settings.secrets_key, dev_mode=False, state_dir=settings.state_dir)  # refuse to start without one
    owned: list[Callable[[], Any]] = []
    # the Trainer refuses calls without the service token; a dev-mode token is read (or made) at the first call
    authorization = functools.cache(lambda: rpcauth.service_authorization(settings))
    if not settings.dev_mode and (trainer is None or experiments is None):
        authorization()  # refuse to start without one
    if trainer is None:
        trainer = TrainerClient(settings.trainer_address, authorization=authorization)
        owned.append(trainer.close)
        # a Trainer handed in (a test's twin, a dashboard developer's fake) is used as it is
        if settings.job_cache_seconds > 0:
            trainer = CachingTrainer(trainer, settings.job_cache_seconds, render=job_routes.render_job)
    if experiments is None:
        experiments = ExperimentCalls(settings.trainer_address, authorization=authorization)  # a channel connects on its first call
        owned.append(experiments.close)
    if identity is None:
        identity = IdentityStore(mongo.connect(settings.mongo_url, settings.mongo_db),
                                 cache_seconds=settings.auth_cache_seconds)
        owned.append(identity.close)
    own_logs = logs is None
    if logs is None:
        logs = LogStore(settings.logstore_url, settings.logstore_index)
        owned.append(logs.close)
    if objects is None:
        objects = store_from_settings(settings)
    if audit is None:
        audit = AuditLog(identity.db)
    if limiter is None and settings.rate_limit_shared:  # one allowance across API replicas
        limiter = SharedRateLimiter(identity.db, settings.rate_limit_per_second, settings.rate_limit_burst)
    if limiter is None:
        limiter = RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        # 0: no sweeper (an API built for a test may have no identity store to read policies from)
        sweeper = (retention.start_sweeper(settings, trainer, objects, logs, audit, identity.db)
                   if settings.retention_interval else None)
        if own_logs:  # not a Loop: a one-shot call at start, off the request path
            threading.Thread(target=_create_log_index, args=(logs,), name="log-index", daemon=True).start()
        yield
        if sweeper is not None:
            sweeper.stop()
        for close in owned:
            try:
                close()
            except Exception:  # noqa: BLE001 - shutting down; report and go on
                log.warning("error while closing %s", close, exc_info=True)

    app = FastAPI(title="trainforge", version="1", description=DESCRIPTION, lifespan=lifespan)
    app.state.settings = settings
    app.state.trainer = trainer
    app.state.experiments = experiments
    app.state.identity = identity
    app.state.logs = logs
    app.state.objects = objects
    app.state.tokens = tokens
    app.state.audit = audit
    app.state.limiter = limiter
    app.state.webhook_policy = destinations.policy(settings.webhook_allow, settings.service_addresses())
    app.state.gateway = _gateway(settings, trainer, objects, logs, owned)
    app.state.secrets = secrets  # None: made on first use (trainforge_services.api.routes.secrets), so building touches nothing

    app.add_exception_handler(TrainforgeError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(_CatchAll)
    app.add_middleware(_UploadLimit, max_bytes=settings.max_upload_bytes + _FORM_ALLOWANCE)
    # outermost, so refusals (413, 401, 429) and crashes are audited too
    app.add_middleware(AuditMiddleware, audit=audit)

    for module in (job_routes, experiment_routes, workflow_routes, observe_routes, output_routes, secret_routes, notification_routes, team_routes,
                   auth_routes, admin_routes, admin_job_routes, retention_routes, health_routes):
        app.include_router(_publish_roles(module.router))
    app.include_router(gateway_routes.router)  # authenticated by each job's own token, not an API key
    prom.install(app)
    ui.install(app)
    return app

"""/ui: the dashboard's pages, server-rendered shells whose own scripts read the REST API.

The pages carry no data of their own beyond who is logged in: each page's script
(static/*.js) calls the same /v1 routes the CLI does, with the session cookie and
the page's CSRF token, so every rule — roles, team scoping (another team's job is a
404), halt/resume/cancel transitions, quota validation — is the API's, once.
A page is refused here too, before any script runs: no session → the login page;
a member on an admin page → 403; another team's job → 404.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import jinja2
from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from trainforge_services.api.deps import IdentityDep, TokensDep, TrainerDep, authenticate
from trainforge_services.api.identity import KEY_PREFIX, Role, Tenant
from trainforge_services.api.ui import session
from trainforge_services.common.contracts import ids
from trainforge_services.common.errors import NotFound, PermissionDenied, TrainforgeError, Unauthenticated

HERE = Path(__file__).parent
# autoescape everywhere, whatever a template's name: job names, reasons, messages are all data
templates = Jinja2Templates(env=jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                                   autoescape=True))
router = APIRouter(prefix=session.UI_PATH, include_in_schema=False)


def _tenant(request: Request) -> tuple[Tenant, str] | None:
    token = request.cookies.get(session.SESSION_COOKIE)
    if not token:
        return None
    try:
        return authenticate(token, request.app.state.identity, request.app.state.tokens), token
    except Unauthenticated:
        return None


def _to_login() -> RedirectResponse:
    response = RedirectResponse(f"{session.UI_PATH}/login", status_code=303)
    response.delete_cookie(session.SESSION_COOKIE, path="/")
    return response


def _page(request: Request, name: str, who: tuple[Tenant, str], status: int = 200, **context) -> HTMLResponse:
    tenant, token = who
    return templates.TemplateResponse(request, name, {
        "team": tenant.team, "role": tenant.role.value, "key_id": tenant.key_id,
        "is_admin": tenant.role.at_least(Role.PLATFORM_ADMIN),
        "csrf": session.csrf_for(request.app.state.settings.jwt_secret, token), **context}, status_code=status)


def _error(request: Request, who: tuple[Tenant, str], status: int, message: str) -> HTMLResponse:
    return _page(request, "error.html", who, status=status, status_code=status, message=message)


@router.get("", include_in_schema=False)
@router.get("/", include_in_schema=False)
def home() -> RedirectResponse:
    return RedirectResponse(f"{session.UI_PATH}/jobs", status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request) -> HTMLResponse:
    return _login_form(request)


def _login_form(request: Request, message: str = "", status: int = 200) -> HTMLResponse:
    token = session.new_login_token()
    response = templates.TemplateResponse(request, "login.html", {"message": message, "csrf": token},
                                          status_code=status)
    session.set_login_csrf(response, request, token)
    return response


@router.post("/login")
def login(request: Request, identity: IdentityDep, tokens: TokensDep,
          api_key: Annotated[str, Form(max_length=200)] = "", csrf: Annotated[str, Form(max_length=200)] = "") -> Response:
    try:
        session.check_login_csrf(request, csrf)
    except PermissionDenied as e:
        return _login_form(request, e.message, 403)
    if not api_key.startswith(KEY_PREFIX):
        return _login_form(request, "api_key: paste an API key (tf_…)", 401)
    try:
        tenant = identity.authenticate(api_key.strip())
    except (Unauthenticated, TrainforgeError) as e:
        return _login_form(request, f"api_key: {e.message}", 401)
    request.state.tenant = tenant
    claims = tokens.issue(tenant, key_expires_at=identity.key_expiry(tenant.key_id))
    response = RedirectResponse(f"{session.UI_PATH}/jobs", status_code=303)
    session.set_session(response, request, tokens.encode(claims), max(1, int(claims.expires_at - claims.issued_at)))
    response.delete_cookie(session.LOGIN_CSRF_COOKIE, path=session.UI_PATH)
    return response


@router.post("/logout")
def logout(request: Request, csrf: Annotated[str, Form(max_length=200)] = "") -> Response:
    token = request.cookies.get(session.SESSION_COOKIE)
    if token:
        try:
            session.check_csrf(request.app.state.settings.jwt_secret, token, csrf)
        except PermissionDenied as e:
            return HTMLResponse(e.message, status_code=403)
    response = RedirectResponse(f"{session.UI_PATH}/login", status_code=303)
    session.clear_session(response, request)
    return response


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request) -> Response:
    who = _tenant(request)
    return _page(request, "jobs.html", who) if who else _to_login()


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, trainer: TrainerDep, job_id: str) -> Response:
    who = _tenant(request)
    if not who:
        return _to_login()
    if not ids.is_job_id(job_id):
        return _error(request, who, 404, "no such job")
    try:
        job = trainer.get_job(who[0].team, job_id)
    except NotFound:
        return _error(request, who, 404, "no such job")
    return _page(request, "job.html", who, job_id=job["id"], job_name=job["name"])


@router.get("/team", response_class=HTMLResponse)
def team_page(request: Request) -> Response:
    who = _tenant(request)
    return _page(request, "team.html", who) if who else _to_login()


@router.get("/admin", response_class=HTMLResponse)
def admin_page(request: Request) -> Response:
    who = _tenant(request)
    if not who:
        return _to_login()
    if not who[0].role.at_least(Role.PLATFORM_ADMIN):
        return _error(request, who, 403, "the admin pages need a platform_admin key")
    return _page(request, "admin.html", who)

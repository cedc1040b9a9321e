"""Dashboard sessions: an API key exchanged for a short-lived JWT in a cookie, and CSRF tokens.

The session cookie holds the same JWT `POST /v1/auth/token` issues (services/api/tokens.py), so a
session ends when the token expires, and also at once when its key is revoked or its team
disabled: every request looks the key up again (services/api/deps.py `authenticate`). The cookie
is HttpOnly (page scripts never see the token), SameSite=Strict and, when the request came over
TLS, Secure.

CSRF: SameSite is not enough on its own (older browsers, same-site subdomains), so every
state-changing request authenticated by the cookie must also carry a token the page got from the
server: `X-CSRF-Token` (the pages' scripts) or a `csrf` form field (the login and logout forms).
A session's token is an HMAC of the session's JWT under the API's JWT secret (a synchronizer token
with nothing stored); before login, the login form's token is double-submitted against a random
cookie. A cross-site form post carries neither and is refused with 403.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fastapi import Request, Response

from trainforge_services.common.errors import PermissionDenied

SESSION_COOKIE = "tf_session"
LOGIN_CSRF_COOKIE = "tf_login_csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
UI_PATH = "/ui"


def csrf_for(secret: str, session: str) -> str:
    """The CSRF token of one session: it changes with every login and means nothing without the secret."""
    return hmac.new(secret.encode(), b"csrf:" + session.encode(), hashlib.sha256).hexdigest()


def check_csrf(secret: str, session: str, presented: str | None) -> None:
    if not presented or not hmac.compare_digest(presented, csrf_for(secret, session)):
        raise PermissionDenied("missing or wrong CSRF token: reload the page and try again")


def secure(request: Request) -> bool:
    return request.url.scheme == "https"


def set_session(response: Response, request: Request, token: str, max_age: int) -> None:
    response.set_cookie(SESSION_COOKIE, token, max_age=max_age, path="/", httponly=True, samesite="strict",
                        secure=secure(request))


def clear_session(response: Response, request: Request) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=secure(request))


def new_login_token() -> str:
    return secrets.token_urlsafe(32)


def set_login_csrf(response: Response, request: Request, token: str) -> None:
    response.set_cookie(LOGIN_CSRF_COOKIE, token, max_age=3600, path=UI_PATH, httponly=True, samesite="strict",
                        secure=secure(request))


def check_login_csrf(request: Request, presented: str | None) -> None:
    expected = request.cookies.get(LOGIN_CSRF_COOKIE)
    if not expected or not presented or not hmac.compare_digest(expected, presented):
        raise PermissionDenied("missing or wrong CSRF token: reload the login page and try again")

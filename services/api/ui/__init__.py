"""The web dashboard under /ui, served by the API process: pages, their scripts and styles, no CDN.

`install(app)` adds the page routes (routes.py), the static files shipped in this package
(static/: own JavaScript and CSS, SVG charts drawn by our own code) and the security headers
every /ui response carries: a Content-Security-Policy that allows scripts only from this origin
(no inline script, no inline event handler, no eval), and no framing.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainforge_services.api.ui import routes, session

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"), (b"referrer-policy", b"same-origin"),
            (b"cache-control", b"no-store")]


class SecurityHeaders:
    """Adds the dashboard's headers to every response under /ui."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(session.UI_PATH):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in _HEADERS if h[0] not in names)]
            await send(message)

        await self.app(scope, receive, with_headers)


def install(app: FastAPI) -> None:
    app.include_router(routes.router)
    app.mount(f"{session.UI_PATH}/static", StaticFiles(directory=routes.HERE / "static"), name="ui-static")
    app.add_middleware(SecurityHeaders)

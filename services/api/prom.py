"""The API's Prometheus `/metrics`: request counts and latency per route, and its gRPC client figures.

Routes are labelled by their template (`/v1/jobs/{job_id}`), never the
raw path, so job ids do not multiply the series. `/metrics` itself needs no
key (it says nothing about any team); keep the port private where that
matters.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainforge_services.common import rpc
from trainforge_services.common.observability import service_registry

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def install(app: FastAPI) -> None:
    registry = service_registry({"client": rpc.CLIENT_STATS})
    requests = Counter("trainforge_http_requests", "HTTP requests by route and status",
                       ["method", "route", "status"], registry=registry)
    latency = Histogram("trainforge_http_request_seconds", "HTTP request latency by route (to the response head)",
                        ["method", "route"], buckets=_BUCKETS, registry=registry)

    app.add_middleware(_Observe, requests=requests, latency=latency)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class _Observe:
    """Count each HTTP request and time it to its response head, labelled by route template.

    A plain ASGI middleware: Starlette's BaseHTTPMiddleware runs every request
    through a task and a memory stream, which cost more than the route on a
    cached GET.
    """

    def __init__(self, app: ASGIApp, requests: Counter, latency: Histogram):
        self.app = app
        self.requests = requests
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        took: float | None = None

        async def timing_send(message: Message) -> None:
            nonlocal status, took
            if message["type"] == "http.response.start":
                status = message["status"]
                took = time.perf_counter() - start
            await send(message)

        try:
            await self.app(scope, receive, timing_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope.get("method", "")
            self.requests.labels(method, route, str(status)).inc()
            self.latency.labels(method, route).observe(took if took is not None else time.perf_counter() - start)

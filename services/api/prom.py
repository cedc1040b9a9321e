"""The API's Prometheus `/metrics`: request counts and latency per route, and its gRPC client figures.

Routes are labelled by their template (`/v1/jobs/{job_id}`), never the
raw path, so job ids do not multiply the series. `/metrics` itself needs no
key (it says nothing about any team); keep the port private where that
matters.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from starlette.middleware.base import BaseHTTPMiddleware

from trainforge_services.common import rpc
from trainforge_services.common.observability import service_registry

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def install(app: FastAPI) -> None:
    registry = service_registry({"client": rpc.CLIENT_STATS})
    requests = Counter("trainforge_http_requests", "HTTP requests by route and status",
                       ["method", "route", "status"], registry=registry)
    latency = Histogram("trainforge_http_request_seconds", "HTTP request latency by route (to the response head)",
                        ["method", "route"], buckets=_BUCKETS, registry=registry)

    async def observe(request: Request, call_next):  # noqa: ANN001, ANN202
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = getattr(request.scope.get("route"), "path", None) or "unmatched"
            requests.labels(request.method, route, str(status)).inc()
            latency.labels(request.method, route).observe(time.perf_counter() - start)

    app.add_middleware(BaseHTTPMiddleware, dispatch=observe)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

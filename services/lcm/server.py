"""Binds the LCM's servicer to a port; the lifecycle is passed in or built from settings.

Kept apart from `__main__` so tests serve an LCM in-process with the
lifecycle they built (and close themselves).
"""

from __future__ import annotations

import logging

import grpc

from protos import lcm_pb2_grpc
from services.common import rpc
from services.common.settings import LcmSettings
from services.lcm.backends import make_backend
from services.lcm.lifecycle import Lifecycle
from services.lcm.servicer import LcmServicer

log = logging.getLogger(__name__)


def build_lifecycle(settings: LcmSettings) -> Lifecycle:
    """The backend settings name, under a lifecycle with its own etcd connection."""
    return Lifecycle.from_settings(settings, make_backend(settings))


def serve(settings: LcmSettings, lifecycle: Lifecycle | None = None) -> tuple[grpc.Server, int]:
    """A started server on `settings.lcm_address` (port 0 picks one) and its port.

    A lifecycle built here lives as long as the process; pass one in to close it yourself.
    """
    if lifecycle is None:
        lifecycle = build_lifecycle(settings)
    server, port = rpc.make_server(settings.lcm_address)
    lcm_pb2_grpc.add_LifecycleManagerServicer_to_server(LcmServicer(lifecycle), server)
    server.start()
    log.info("LCM (%s backend) serving on port %d", lifecycle.name, port)
    return server, port

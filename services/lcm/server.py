"""Binds the LCM's servicer to a port; the backend is passed in or built from settings.

Kept apart from `__main__` so tests serve an LCM in-process with the backend
they built (and close themselves).
"""

from __future__ import annotations

import logging

import grpc

from protos import lcm_pb2_grpc
from services.common import rpc
from services.common.settings import LcmSettings
from services.lcm.backends import Backend, make_backend
from services.lcm.servicer import LcmServicer

log = logging.getLogger(__name__)


def serve(settings: LcmSettings, backend: Backend | None = None) -> tuple[grpc.Server, int]:
    """A started server on `settings.lcm_address` (port 0 picks one) and its port.

    A backend built here lives as long as the process; pass one in to close it yourself.
    """
    if backend is None:
        backend = make_backend(settings)
    server, port = rpc.make_server(settings.lcm_address)
    lcm_pb2_grpc.add_LifecycleManagerServicer_to_server(LcmServicer(backend), server)
    server.start()
    log.info("LCM (%s backend) serving on port %d", backend.name, port)
    return server, port

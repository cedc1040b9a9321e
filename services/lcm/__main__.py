"""`python -m trainforge_services.lcm`: the Lifecycle Manager process.

Reads LcmSettings from TF_* variables and serves until SIGTERM or SIGINT.
Stopping the LCM never stops learners or job monitors: they run in their own
sessions and the next LCM's lifecycle adopts them from its records.
"""

from __future__ import annotations

import logging
import sys

from pydantic import ValidationError

from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.observability import configure_logging
from trainforge_services.common.process import start_service
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.wiring import build_lifecycle, build_replica, serve, server_auth

log = logging.getLogger("trainforge_services.lcm")


def main() -> int:
    stop = start_service()
    try:
        settings = LcmSettings()
    except ValidationError as e:
        log.error("invalid settings: %s", e)
        return 2
    if settings.log_json:
        configure_logging(json_logs=True)
    try:
        server_auth(settings)  # its keys are checked before anything starts
        lifecycle = build_replica(settings) if settings.elect else build_lifecycle(settings)
        server, _ = serve(settings, lifecycle)
        if settings.elect:
            lifecycle.start()
    except TrainforgeError as e:
        log.error("cannot start the LCM: %s", e.message)
        return 1
    except ValueError as e:  # settings it cannot serve with, e.g. no service token outside dev mode
        log.error("cannot start the LCM: %s", e)
        return 1
    stop.wait()
    log.info("stopping; learners keep running")
    server.stop(5).wait()
    lifecycle.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m trainforge_services.trainer`: the Trainer process.

Reads TrainerSettings from TF_* variables, serves until SIGTERM or SIGINT,
then stops taking requests and lets in-flight LCM calls finish.
"""

from __future__ import annotations

import logging
import sys

from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.observability import configure_logging
from trainforge_services.common.process import start_service
from trainforge_services.common.settings import TrainerSettings
from trainforge_services.trainer.wiring import serve

log = logging.getLogger("trainforge_services.trainer")


def main() -> int:
    stop = start_service()
    settings = TrainerSettings()
    if settings.log_json:
        configure_logging(json_logs=True)
    try:
        trainer = serve(settings)
    except TrainforgeError as e:
        log.error("cannot start the Trainer: %s", e.message)
        return 1
    except ValueError as e:  # settings it cannot serve with, e.g. no secrets key outside dev mode
        log.error("cannot start the Trainer: %s", e)
        return 1
    stop.wait()
    log.info("stopping")
    trainer.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

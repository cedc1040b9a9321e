"""`python -m trainforge_services.controller --spec learner-<r>.json`: the process the LCM starts per learner.

Settings come from TF_* variables; logs of the controller itself go to
stderr. SIGTERM and SIGINT are turned into a stop request, so the learner is
given its grace period and the final status is still written. The exit code
is 0 whenever the controller did its job, even when the learner failed: the
learner's outcome is in etcd, not here.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from trainforge_services.common import niceness
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.settings import ControllerSettings

from .controller import Controller

log = logging.getLogger("trainforge_services.controller")

# The controller could not even begin: a bad spec or bad settings.
EXIT_USAGE = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainforge_services.controller",
                                     description="Run one learner and report it to etcd.")
    parser.add_argument("--spec", required=True, type=Path, help="the learner spec file written by the LCM")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s controller[%(process)d] %(levelname)s %(name)s: %(message)s")
    # One line per log-store request drowns the controller's own story.
    logging.getLogger("elastic_transport").setLevel(logging.WARNING)
    try:
        settings = ControllerSettings()
        spec = LearnerSpec.load(args.spec)
    except ValidationError as e:
        log.error("invalid TF_* settings: %s", e)
        return EXIT_USAGE
    except TrainforgeError as e:
        log.error("%s", e.message)
        return EXIT_USAGE
    for problem in niceness.lower(settings.job_nice):  # before any thread starts: threads inherit it
        log.warning("running at the control plane's priority: %s", problem)
    try:
        controller = Controller(spec, settings)
    except ValueError as e:
        log.error("cannot use TF_ETCD_ENDPOINTS=%r: %s", settings.etcd_endpoints, e)
        return EXIT_USAGE

    def on_signal(signum: int, _frame: object) -> None:
        controller.request_stop(f"the controller received {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return controller.run()


if __name__ == "__main__":
    sys.exit(main())

"""`python -m trainforge_services.jobmonitor --spec <attempt dir>/monitor.json`: one job attempt's monitor.

Started by the LCM in its own session, so it outlives an LCM restart. Reads
MonitorSettings from TF_* variables (the LCM passes its own through), logs
to stderr (the LCM points that at `<attempt dir>/monitor.log`), and exits 0
once it has reported a terminal state (or HALTED; it then leaves
`monitor.done` next to its spec), when another monitor already watches the
job, or on SIGTERM/SIGINT. A bad spec or settings exit 2. A monitor killed
before its `monitor.done` is started again by the LCM and resumes from etcd.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from trainforge_services.common import jobcreds, niceness, rpcauth
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.contracts.specs import MonitorSpec
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.keys import MONITOR_DONE
from trainforge_services.common.process import LOG_FORMAT
from trainforge_services.common.settings import MonitorSettings
from trainforge_services.jobmonitor.monitor import GrpcReporter, JobMonitor

log = logging.getLogger("trainforge_services.jobmonitor")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainforge_services.jobmonitor",
                                     description="Aggregate one job attempt's learner states for the Trainer.")
    parser.add_argument("--spec", required=True, help="path of monitor.json written by the LCM")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=LOG_FORMAT)
    try:
        settings = MonitorSettings()
        spec = MonitorSpec.load(args.spec)
    except ValidationError as e:
        log.error("invalid settings: %s", e)
        return 2
    except TrainforgeError as e:
        log.error("%s", e.message)
        return 2
    for problem in niceness.lower(settings.job_nice):  # before any thread starts: threads inherit it
        log.warning("running at the control plane's priority: %s", problem)
    coordinator = Coordinator.of(settings)
    if not settings.monitor_token:
        log.warning("job %s: no TF_MONITOR_TOKEN was granted; the Trainer will refuse this monitor's reports",
                    spec.job_id)
    reporter = GrpcReporter(settings.trainer_address, authorization=rpcauth.job_authorization(
        jobcreds.MONITOR, spec.job_id, settings.monitor_token) if settings.monitor_token else "")
    monitor = JobMonitor(spec, coordinator, reporter, retry_seconds=settings.report_retry_seconds,
                         lease_ttl=settings.lease_ttl)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: monitor.stop())
    try:
        rc = monitor.run()
        if monitor.finished:
            # tells the LCM's supervision that this monitor's work is done (it restarts one that died before)
            (Path(args.spec).parent / MONITOR_DONE).touch()
        return rc
    finally:
        reporter.close()
        coordinator.close()


if __name__ == "__main__":
    sys.exit(main())

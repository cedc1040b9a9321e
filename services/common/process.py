"""What every long-running service process does first: log to stderr, turn SIGTERM/SIGINT into an Event."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import threading

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# A service still running this long after it was asked to stop writes every thread's stack to stderr (its
# log), once: whoever then has to kill it can read what it was stuck on.
SLOW_STOP_S = 8.0


def start_service(slow_stop_s: float = SLOW_STOP_S) -> threading.Event:
    """Configure logging to stderr and return an Event that SIGTERM or SIGINT sets (call from the main thread)."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=LOG_FORMAT)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if not stop.is_set():
            faulthandler.dump_traceback_later(slow_stop_s, exit=False, file=sys.stderr)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    return stop

"""What every long-running service process does first: log to stderr, turn SIGTERM/SIGINT into an Event."""

from __future__ import annotations

import logging
import signal
import sys
import threading

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def start_service() -> threading.Event:
    """Configure logging to stderr and return an Event that SIGTERM or SIGINT sets (call from the main thread)."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=LOG_FORMAT)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    return stop

"""Stopping a running learner: the stop request, the manifest's timeout, SIGTERM and then SIGKILL.

Whoever wants the learner gone - a signal to the controller, a halt
(services/controller/halt.py), the manifest's `timeout:` - makes a
`StopRequest`; the first reason given is the one reported. `wait_for_learner`
waits for the learner's exit and turns a request into SIGTERM to its whole
process group, then SIGKILL once `kill_grace` has passed.
"""

from __future__ import annotations

import signal
import threading
import time

from .learner import LearnerProcess
from .logship import LogArchive
from .outcome import system_line


class StopRequest:
    """Set once, with the reason that comes first; safe from a signal handler."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""
        self.timed_out = False  # the manifest's timeout asked first: the job ends, without a restart

    def request(self, reason: str, *, timed_out: bool = False) -> None:
        if not self._event.is_set():
            self.reason = reason
            self.timed_out = timed_out
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


def wait_for_learner(learner: LearnerProcess, archive: LogArchive, stop: StopRequest, *, grace: float,
                     timeout: float | None) -> tuple[int, bool]:
    """Wait for the learner, forwarding a stop request as SIGTERM and then SIGKILL; (returncode, killed)."""
    kill_at: float | None = None
    killed = False
    deadline = time.monotonic() + timeout if timeout else None
    while (returncode := learner.wait(0.2)) is None:
        if deadline is not None and time.monotonic() >= deadline and not stop.is_set():
            stop.request(f"ran longer than {duration(timeout)} (the manifest's timeout)", timed_out=True)
        if stop.is_set() and kill_at is None:
            system_line(archive, f"{stop.reason}: sending SIGTERM, SIGKILL after {grace:g}s")
            learner.signal_group(signal.SIGTERM)
            kill_at = time.monotonic() + grace
        elif kill_at is not None and not killed and time.monotonic() >= kill_at:
            system_line(archive, "the learner outlived its grace period: sending SIGKILL")
            learner.signal_group(signal.SIGKILL)
            killed = True
    # The shell running the command dies of the SIGTERM at once (dash does not exec a command),
    # while the program it started may still be saving its checkpoint: wait for the whole group.
    while kill_at is not None and not killed and learner.group_alive():
        if time.monotonic() >= kill_at:
            system_line(archive, "the learner outlived its grace period: sending SIGKILL")
            learner.signal_group(signal.SIGKILL)
            killed = True
        else:
            time.sleep(0.05)
    return returncode, killed


def duration(seconds: float) -> str:
    """7200 -> '2h', 90 -> '90s': as a user would write the manifest's timeout."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"

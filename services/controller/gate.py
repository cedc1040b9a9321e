"""A gated learner's wait (docs/EXPERIMENTS.md, "Prestarted trials"): everything is prepared, the learner
starts only once the job's etcd `gate` key is there.

A trial started ahead of its slot is deployed with `gated` in its spec: its
controller prepares the workdir, data, checkpoint, environment and sandbox
as for any job, publishes PREPARING with the message `HELD` and waits here.
The Trainer's experiment driver opens the gate (LifecycleManager.OpenGate)
the moment a slot of the experiment frees, and the learner starts at once.

The wait is a watch on the key, not a poll: the first event is the key's
current value (a gate opened before the controller started counts), and a
put wakes the waiter as soon as etcd delivers it. A stop request (a halt,
a cancel's SIGTERM) ends the wait within `poll` seconds. A gate is per job
and never closed again, so any well-formed value opens it.

The watch rides out etcd restarts itself (Coordinator.watch_prefix). If it
fails anyway (an error it does not handle, or it ends), it is started again
from a fresh read of the key, up to WATCH_RETRIES times; after that the wait
raises GateWatchFailed with the error, and the controller fails the attempt
with that reason rather than holding its learner until someone stops it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from trainforge_services.common.adapters.etcd import Coordinator, StopEvent
from trainforge_services.common.contracts.etcd import GateOpen
from trainforge_services.common.retry import STEADY, Stopped

log = logging.getLogger(__name__)

# what a held learner's PREPARING status says (the job monitor makes it the job's reason)
HELD = "held: prepared; its learner starts when the experiment frees a slot (prestart)"
# How often a failed watch of the gate key is started again, and the first pause before a new start (the STEADY
# policy's shape from there).
WATCH_RETRIES = 3
WATCH_RETRY_PAUSE = 0.5


class GateWatchFailed(Exception):
    """The gate key could not be watched (after WATCH_RETRIES new starts); the message says why."""


class _WatchEnded(Exception):
    """One watch of the gate key ended before the gate opened; the message says why."""


def wait_for_gate(coord: Coordinator, job_id: str, stopped: Callable[[], bool], *, poll: float = 0.2,
                  retries: int = WATCH_RETRIES, retry_pause: float = WATCH_RETRY_PAUSE) -> bool:
    """Block until the job's gate is open (True) or `stopped()` says to give up (False); raises
    GateWatchFailed when the key's watch failed `retries + 1` times."""
    key = coord.keys.gate(job_id)
    opened = threading.Event()
    failed: list[str] = []  # set (with why) once the watch is given up; `done` wakes the waiter
    done = threading.Event()
    stop_watch = StopEvent()

    def is_open(value: dict | None) -> bool:
        if GateOpen.parse_or_none(value) is not None:
            return True
        if value is not None:
            log.warning("ignoring the value at %s: not a gate", key)
        return False

    def watch_once() -> str:
        """'' once the gate opened or the wait is over; else why this watch ended."""
        try:
            for event in coord.watch_prefix(key, stop=stop_watch):  # a new watch starts with a fresh read
                if event.kind == "resync":
                    found = is_open((event.snapshot or {}).get(key))
                else:
                    found = event.kind == "put" and event.key == key and is_open(event.value)
                if found:
                    opened.set()
                    return ""
        except Exception as e:  # noqa: BLE001 - reported to the waiter, which must not hang on it
            log.warning("watching the gate key %s failed: %s: %s", key, type(e).__name__, e)
            return f"{type(e).__name__}: {e}"
        return "" if stop_watch.is_set() else "the watch ended"

    def watch_or_raise() -> None:
        if why := watch_once():
            raise _WatchEnded(why)

    def again(_error: BaseException, attempt: int, _delay: float) -> None:
        log.info("watching the gate key %s again (%d of %d)", key, attempt, retries)

    def watch() -> None:
        try:
            STEADY.starting(retry_pause).within(attempts=retries + 1).call(
                watch_or_raise, retry_on=_WatchEnded, stop_event=stop_watch, on_retry=again)
        except Stopped:
            pass  # the wait is over
        except _WatchEnded as e:
            failed.append(f"watching the job's gate failed {retries + 1} times (last: {e})")
        finally:
            done.set()

    # not a Loop: one blocking watch of the key (started again when it fails) for the waiter below
    thread = threading.Thread(target=watch, name="gate-watch", daemon=True)
    thread.start()
    try:
        while not opened.is_set():
            done.wait(poll)
            if opened.is_set():
                break
            if failed:
                raise GateWatchFailed(failed[0])
            if stopped():
                return False
        return True
    finally:
        stop_watch.set()
        thread.join(2.0)

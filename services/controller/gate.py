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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from trainforge_services.common.adapters.etcd import Coordinator, StopEvent
from trainforge_services.common.contracts.etcd import GateOpen

log = logging.getLogger(__name__)

# what a held learner's PREPARING status says (the job monitor makes it the job's reason)
HELD = "held: prepared; its learner starts when the experiment frees a slot (prestart)"


def wait_for_gate(coord: Coordinator, job_id: str, stopped: Callable[[], bool], *, poll: float = 0.2) -> bool:
    """Block until the job's gate is open (True) or `stopped()` says to give up (False)."""
    key = coord.keys.gate(job_id)
    opened = threading.Event()
    stop_watch = StopEvent()

    def is_open(value: dict | None) -> bool:
        if GateOpen.parse_or_none(value) is not None:
            return True
        if value is not None:
            log.warning("ignoring the value at %s: not a gate", key)
        return False

    def watch() -> None:
        try:
            for event in coord.watch_prefix(key, stop=stop_watch):
                if event.kind == "resync":
                    found = is_open((event.snapshot or {}).get(key))
                else:
                    found = event.kind == "put" and event.key == key and is_open(event.value)
                if found:
                    opened.set()
                    return
        except Exception:  # noqa: BLE001 - the waiter gives up on a stop; without one it would hang
            log.exception("watching the gate key failed")

    thread = threading.Thread(target=watch, name="gate-watch", daemon=True)
    thread.start()
    try:
        while not opened.wait(poll):
            if stopped():
                return False
        return True
    finally:
        stop_watch.set()
        thread.join(2.0)

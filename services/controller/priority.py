"""Where the controller's output threads run: below the learner, and off its CPUs where the host has spare ones.

The threads that turn the learner's output into archive lines and ship them
(services/controller/spool.py, logship.py) run at nice 19: where they
compete with the learner for a CPU the learner wins (CFS weight 1024 against
15), and on an idle core they run at full speed. Lines are never dropped for
it, only indexed later. Linux keeps nice values per thread, so this touches
neither the learner nor the controller's own status and halt threads.

CPU placement: when the CPUs this controller may use outnumber the job's
`resources.cpus` (rounded up), `plan_placement` leaves the learner the last
ceil(cpus) of them and gives the output threads (pipe readers, splitters,
shipper) the rest, each thread pinned by its native id
(`os.sched_setaffinity`), so the work a flood of output causes does not
queue on the learner's CPU. A job that asked for as many CPUs as there are
(or more) is not placed at all. `TF_PLACE_CPUS` (ControllerSettings):
`output`, the default, pins only the output threads; `all` pins the
learner to its CPUs too, which suits a host running one job: every
controller on a host picks the same last CPUs, so with several jobs their
learners would share them; `off` places nothing. Measured on a 2-vCPU host
only, where the gain is within the noise (docs/BENCHMARKS.md, "Log
flood").
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from dataclasses import dataclass

BACKGROUND_NICE = 19

_lock = threading.Lock()
_output_cpus: frozenset[int] | None = None
_output_threads: set[int] = set()  # native ids of live output threads, placed again when the plan changes


@dataclass(frozen=True)
class Placement:
    learner: frozenset[int]
    output: frozenset[int]


def plan_placement(cpus: float, allowed: set[int] | None = None) -> Placement | None:
    """The learner's and the output threads' CPUs for a job of `cpus` CPUs, None when there is none to spare.

    `allowed` defaults to the calling thread's affinity (a cgroup cpuset or an outer pin narrows it).
    """
    if allowed is None:
        try:
            allowed = os.sched_getaffinity(0)
        except (OSError, AttributeError):
            return None
    need = max(1, math.ceil(cpus))
    if need >= len(allowed):
        return None
    ordered = sorted(allowed)
    return Placement(frozenset(ordered[-need:]), frozenset(ordered[:-need]))


def set_output_cpus(cpus: frozenset[int] | None) -> None:
    """Pin the output threads (those started and those to come) to `cpus`; None: leave them where they are."""
    global _output_cpus
    with _lock:
        _output_cpus = cpus
        ids = list(_output_threads)
    if cpus:
        for tid in ids:
            _pin(tid, cpus)


def _pin(tid: int, cpus: frozenset[int]) -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setaffinity(tid, cpus)


def output_thread() -> None:
    """Register the calling thread as an output thread: placed on the output CPUs when there is a plan."""
    tid = threading.get_native_id()
    with _lock:
        _output_threads.add(tid)
        cpus = _output_cpus
    if cpus:
        _pin(tid, cpus)


def output_thread_done() -> None:
    with _lock:
        _output_threads.discard(threading.get_native_id())


def background_priority() -> None:
    """Lower the calling thread's CPU priority to BACKGROUND_NICE (a no-op where the OS refuses)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)

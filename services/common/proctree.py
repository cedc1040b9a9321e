"""Stopping processes and everything they started: the one process-tree killer.

Used by the LCM's local backend (a job's monitor, controllers and stray
learners) and by the embedded-stack launcher (`trainforge down`). The rule
is the same for both: SIGTERM to every target (to its whole process group
when it leads one, so helpers it forked go too) and to every descendant,
wait up to a grace period, SIGKILL whatever is left, and say which went
which way. A target that is our own child is reaped while we wait, so it
never lingers as a zombie; a zombie of someone else's counts as gone (it
holds nothing any more).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import psutil

_POLL = 0.05


@dataclass(frozen=True)
class Stopped:
    """Which pids ended on SIGTERM within the grace and which needed SIGKILL (`survivors`: not even then)."""

    terminated: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.terminated) + len(self.killed) + len(self.survivors)


def reap(pid: int) -> bool:
    """True when pid is our own child and has exited (and is now reaped)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def gone(proc: psutil.Process) -> bool:
    """Exited: reaped, vanished, or a zombie (its parent has yet to reap it)."""
    reap(proc.pid)
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return True
    except psutil.AccessDenied:
        return False


def wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to timeout for procs to exit; the ones still running."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive:
        alive = [p for p in alive if not gone(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(_POLL)
    return alive


def with_descendants(procs: Iterable[psutil.Process]) -> dict[int, psutil.Process]:
    """procs and every process they started, by pid."""
    out: dict[int, psutil.Process] = {}
    for proc in procs:
        out[proc.pid] = proc
        try:
            out.update({c.pid: c for c in proc.children(recursive=True)})
        except psutil.Error:
            pass
    return out


def leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except (ProcessLookupError, PermissionError):
        return False


def _signal(groups: Iterable[int], procs: Iterable[psutil.Process], sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def terminate(procs: Iterable[psutil.Process], *, grace: float, groups: Iterable[int] = (),
              kill_wait: float = 5.0) -> Stopped:
    """SIGTERM procs, their descendants and `groups` (pgids), SIGKILL what outlives `grace`.

    A target that leads its own process group gets the signal group-wide as
    well. Returns which of the targets (descendants included) ended how.
    """
    targets = with_descendants(procs)
    pgids = set(groups) | {pid for pid in targets if leads_group(pid)}
    alive = [p for p in targets.values() if not gone(p)]
    if not alive and not pgids:
        return Stopped()
    _signal(pgids, alive, signal.SIGTERM)
    left = wait_gone(alive, grace)
    if left:
        # whatever the grace let them start is found now, before the SIGKILL
        left = [p for p in with_descendants(left).values() if not gone(p)]
        _signal(pgids, left, signal.SIGKILL)
    survivors = wait_gone(left, kill_wait) if left else []
    killed = {p.pid for p in left}
    return Stopped(terminated=sorted(p.pid for p in alive if p.pid not in killed),
                   killed=sorted(killed - {p.pid for p in survivors}),
                   survivors=sorted(p.pid for p in survivors))

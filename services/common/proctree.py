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


@dataclass(frozen=True)
class Row:
    """One process of a `Table`: its parent, its process group, and whether it is a zombie."""

    ppid: int
    pgid: int
    zombie: bool


Table = dict[int, Row]


def table() -> Table:
    """Every process on the machine, by pid, from one read of each `/proc/<pid>/stat`.

    psutil's `process_iter` and `Process.children` each read every process's
    files again, several per process; callers that ask several questions of
    the same moment (a job's groups, its descendants, its orphans) share one
    of these instead. A process that exits meanwhile is simply not in it.
    """
    rows: Table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after its last ")"
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 3:
            continue
        rows[int(name)] = Row(ppid=int(fields[1]), pgid=int(fields[2]), zombie=fields[0] == b"Z")
    return rows


def descendants(pids: Iterable[int], rows: Table) -> set[int]:
    """Every process of `rows` below `pids` (not `pids` themselves)."""
    children: dict[int, list[int]] = {}
    for pid, row in rows.items():
        children.setdefault(row.ppid, []).append(pid)
    out: set[int] = set()
    todo = [c for pid in pids for c in children.get(pid, ())]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, ())
    return out


def process(pid: int) -> psutil.Process | None:
    """psutil's handle of a running pid (it records the start time, so a reused pid is told apart); None if gone."""
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def with_descendants(procs: Iterable[psutil.Process], rows: Table | None = None) -> dict[int, psutil.Process]:
    """procs and every process they started, by pid (from `rows`, or a fresh `table()`)."""
    out: dict[int, psutil.Process] = {p.pid: p for p in procs}
    if not out:
        return out
    for pid in sorted(descendants(out, table() if rows is None else rows) - out.keys()):
        proc = process(pid)
        if proc is not None:
            out[pid] = proc
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
              kill_wait: float = 5.0, rows: Table | None = None) -> Stopped:
    """SIGTERM procs, their descendants and `groups` (pgids), SIGKILL what outlives `grace`.

    A target that leads its own process group gets the signal group-wide as
    well. Returns which of the targets (descendants included) ended how.
    `rows`: a `table()` the caller just took, to find the descendants in.
    """
    targets = with_descendants(procs, rows)
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

"""Jobs yield the CPU to the control plane: the local backend's job processes run at a lower CPU priority.

On the embedded stack the control plane (API, Trainer, LCM, the stores) and
every job's processes (its monitor, its controllers, their learners) share
the machine's cores. Left at equal priority, a machine full of learners
starves the services: submits, the admission pass and the monitors' reports
all wait for a core. Kubernetes keeps CPU for its own daemons
(system-reserved, kube-reserved) and gives pods a weight below them; the
local backend can do the same with nice values. `TF_JOB_NICE` (LcmSettings,
default 0, off; 10 is a CFS weight of 110 against the services' 1024) is handed to the
job monitors and controllers it starts, which lower themselves at start
(`lower`), and a controller gives its learner the same (`lower(pid=...)`;
the learner also inherits the controller's nice through fork and exec).
Where the services are idle the jobs get every core as before: a weight
only matters while both want the CPU.

Linux's autogroup (`kernel.sched_autogroup_enabled`, on by default on most
desktop and VM kernels) schedules each session as one group whose weight
comes from the group's own nice, not its processes': a process that called
setsid (every monitor, controller and learner does) gets a new group at
nice 0, and its own nice then only orders it within that group. So both are
set: the process's nice (what counts without autogroup, and inside the
group) and its session's autogroup nice (`/proc/<pid>/autogroup`, writable
by the process's owner for a nice at or above 0). A learner in a cgroup of
its own (the root sandbox's `trainforge/<job>/…` cpu cgroup) is scheduled by
that cgroup's weight instead, which this leaves at the default.

It is off by default: on a machine shared with other work at nice 0 (other
users' processes, a test run) lowered jobs wait for all of it, and a burst
of 1,000 trivial jobs took 3.5-5x longer with it at load 12-40, while its
gain in submits/s on a quiet machine was within the noise of single runs
(docs/FASTPATH.md, "What bounds it").

Nothing here raises a priority, and a failure to lower one is not an error:
the process runs as it would have, and `lower` says what it could not do.
"""

from __future__ import annotations

import os

MAX_NICE = 19


def lower(nice: int, pid: int = 0) -> list[str]:
    """Run process `pid` (0: the calling one) and its session's autogroup at `nice` at least (0: leave them).

    Call it before the process starts threads: a nice value is per thread on Linux, and threads started later
    inherit the caller's. Returns what could not be done, one line each (empty: all of it done, or nothing asked).
    """
    if not 0 <= nice <= MAX_NICE:
        raise ValueError(f"nice must be 0..{MAX_NICE}, not {nice}")
    if nice == 0:
        return []
    problems = []
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) < nice:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError as e:
        problems.append(f"nice {nice} for pid {pid or os.getpid()}: {e.strerror or e}")
    group = autogroup_nice(pid)  # None: a kernel without autogroup, where the nice value alone decides
    if group is not None and group < nice:
        try:
            with open(f"/proc/{pid or 'self'}/autogroup", "w") as f:
                f.write(str(nice))
        except OSError as e:
            problems.append(f"autogroup nice {nice} for pid {pid or os.getpid()}: {e.strerror or e}")
    return problems


def autogroup_nice(pid: int = 0) -> int | None:
    """The nice of `pid`'s autogroup (0: the calling process), None without autogroup."""
    try:
        with open(f"/proc/{pid or 'self'}/autogroup") as group:
            fields = group.read().split()
    except OSError:
        return None
    return int(fields[2]) if len(fields) >= 3 and fields[1] == "nice" else None

"""The learner's cgroup v1 limits: memory, cpu quota and pids, one folder per controller.

`<root>/<controller>/trainforge/<job>/<rank>-<attempt>/`, created by the
controller (root) before the learner starts and joined by the sandbox's
entry (services/controller/sandbox/enter.py) before it forks, so every
process of the learner is counted. Swap is limited with memory when the
kernel accounts it, so a learner cannot page its way past the limit.

After the learner exited, `oom_killed()` tells whether the kernel's OOM
killer fired in the memory cgroup, which the controller reports naming the
limit; `remove()` deletes the folders (the local backend's stop removes
what a killed controller left, `trainforge_services.common.isolation.remove_job`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from trainforge_services.common.isolation import (
    CGROUP_CONTROLLERS,
    CGROUP_PARENT,
    CGROUP_ROOT,
    remove_cgroups,
)

log = logging.getLogger(__name__)

CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    memory: int
    cpus: float
    pids: int


class LearnerCgroups:
    def __init__(self, job_id: str, rank: int, attempt: int, root: Path = CGROUP_ROOT):
        self.paths = {c: root / c / CGROUP_PARENT / job_id / f"{rank}-{attempt}" for c in CGROUP_CONTROLLERS}

    @property
    def procs_files(self) -> list[str]:
        """The files the sandbox's entry writes its pid to."""
        return [str(p / "cgroup.procs") for p in self.paths.values()]

    def create(self, limits: Limits) -> None:
        """Make the folders and set the limits; OSError naming the file when the kernel refuses."""
        for path in self.paths.values():
            path.mkdir(parents=True, exist_ok=True)
        mem = self.paths["memory"]
        _write(mem / "memory.limit_in_bytes", limits.memory)
        if (mem / "memory.memsw.limit_in_bytes").exists():
            _write(mem / "memory.memsw.limit_in_bytes", limits.memory)
        else:
            _write(mem / "memory.swappiness", 0)
        cpu = self.paths["cpu"]
        _write(cpu / "cpu.cfs_period_us", CPU_PERIOD_US)
        _write(cpu / "cpu.cfs_quota_us", max(1000, math.ceil(limits.cpus * CPU_PERIOD_US)))
        _write(self.paths["pids"] / "pids.max", limits.pids)

    def oom_killed(self) -> bool:
        """Whether the OOM killer killed a process of the learner (or an allocation hit the limit and failed)."""
        try:
            fields = dict(line.split() for line in (self.paths["memory"] / "memory.oom_control").read_text()
                          .splitlines() if line.strip())
        except (OSError, ValueError):
            return False
        return int(fields.get("oom_kill", "0")) > 0

    def remove(self) -> bool:
        return remove_cgroups(list(self.paths.values()))


def _write(path: Path, value: int) -> None:
    try:
        path.write_text(str(value))
    except OSError as e:
        raise OSError(e.errno, f"cannot write {value} to {path}: {e.strerror}") from None

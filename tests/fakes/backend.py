"""A backend that runs nothing: `launch` records the plan and hands out handles a test can "kill".

It implements the whole `Backend` interface in memory, so the lifecycle's
decisions (idempotency, replacement, supervision, reconcile, capacity) are
tested without processes. A test plays the world with `die`, `finish_monitor`
and `forget_process` (an LCM that crashed mid-launch).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path

from trainforge_services.common.errors import TrainforgeError
from trainforge_services.lcm.backends.base import (
    AttemptPlan,
    Backend,
    Capacity,
    Handle,
    JobView,
    Observed,
    Role,
    Site,
)


@dataclass
class FakeJob:
    attempt: int
    alive: dict[Handle, bool] = field(default_factory=dict)
    monitor_done: bool = False


class FakeBackend(Backend):
    name = "fake"

    def __init__(self, root: Path, *, gpus: int = 8, max_learners: int = 64):
        self.root = root
        self.gpus = gpus
        self.max_learners = max_learners
        self.jobs: dict[str, FakeJob] = {}
        self.launched: list[AttemptPlan] = []
        self.stopped: list[str] = []
        self.monitor_restarts: list[str] = []
        self.grown: list[tuple[str, list[int]]] = []
        self.fail_launch = False
        self._ids = itertools.count(100)
        self._lock = threading.Lock()

    def _handle(self, role: Role, rank: int | None = None) -> Handle:
        return Handle(role=role, ref=f"fake-{next(self._ids)}", rank=rank)

    # -- Backend ----------------------------------------------------------------------

    def site(self, job_id: str, attempt: int) -> Site:
        return Site(attempt_dir=self.root / job_id / str(attempt), master_addr="10.0.0.7", master_port=29555)

    def launch(self, plan: AttemptPlan) -> list[Handle]:
        with self._lock:
            job = self.jobs[plan.job_id] = FakeJob(attempt=plan.attempt)
            job.alive[self._handle(Role.MONITOR)] = True
            if self.fail_launch:
                raise TrainforgeError(f"cannot start the controller of job {plan.job_id}")
            for spec in plan.learners:
                job.alive[self._handle(Role.CONTROLLER, spec.rank)] = True
            self.launched.append(plan)
            return list(job.alive)

    def stop(self, job_id: str) -> int:
        with self._lock:
            self.stopped.append(job_id)
            job = self.jobs.pop(job_id, None)
            return sum(job.alive.values()) if job else 0

    def observe(self, plan: AttemptPlan) -> JobView:
        with self._lock:
            job = self.jobs.get(plan.job_id)
            if job is None or job.attempt != plan.attempt:
                return JobView(job_id=plan.job_id)
            return JobView(job_id=plan.job_id, monitor_done=job.monitor_done,
                           processes=tuple(Observed(h, a) for h, a in job.alive.items()))

    def restart_monitor(self, plan: AttemptPlan) -> Handle:
        with self._lock:
            job = self.jobs.setdefault(plan.job_id, FakeJob(attempt=plan.attempt))
            job.alive = {h: a for h, a in job.alive.items() if h.role is not Role.MONITOR}
            handle = self._handle(Role.MONITOR)
            job.alive[handle] = True
            self.monitor_restarts.append(plan.job_id)
            return handle

    def launch_learners(self, plan: AttemptPlan, ranks: list[int]) -> list[Handle]:
        with self._lock:
            job = self.jobs[plan.job_id]
            job.alive = {h: a for h, a in job.alive.items() if h.role is not Role.CONTROLLER or h.rank not in ranks}
            handles = [self._handle(Role.CONTROLLER, rank) for rank in ranks]
            job.alive.update(dict.fromkeys(handles, True))
            self.grown.append((plan.job_id, list(ranks)))
            return handles

    def capacity(self) -> Capacity:
        return Capacity(backend=self.name, gpus=self.gpus, cpus=16.0, memory=2**36, max_learners=self.max_learners)

    # -- the world, as a test plays it -------------------------------------------------------

    def handle(self, job_id: str, name: str) -> Handle:
        return next(h for h in self.jobs[job_id].alive if h.name == name)

    def die(self, job_id: str, *names: str) -> None:
        """The named processes ('monitor', 'controller-0', ...) end; none named: all of them."""
        with self._lock:
            job = self.jobs[job_id]
            for h in job.alive:
                if not names or h.name in names:
                    job.alive[h] = False

    def finish_monitor(self, job_id: str) -> None:
        """The monitor delivered the attempt's last state and exited."""
        self.die(job_id, "monitor")
        self.jobs[job_id].monitor_done = True

    def forget_process(self, job_id: str, name: str) -> None:
        """As if the LCM crashed before this process was started (or recorded)."""
        with self._lock:
            job = self.jobs[job_id]
            job.alive = {h: a for h, a in job.alive.items() if h.name != name}

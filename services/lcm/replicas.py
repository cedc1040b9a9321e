"""One LCM among several: only the replica elected through etcd runs a lifecycle.

With `TF_ELECT=1` each LCM campaigns for `<prefix>/leaders/lcm`
(services/common/election.py). The elected replica builds its `LifecycleManager`
exactly as a restarted LCM does (reconcile the records with what the
backend observes, then supervise: restart dead monitors, report lost
controllers), and serves DeployJob, KillJob, HaltJob, GetCapacity and
SyncTeam. A follower answers them UNAVAILABLE naming itself as a follower;
the Trainer's client (services/trainer/lcm_client.py) asks the next replica
at once. A follower's gRPC health for `trainforge.LifecycleManager` is
NOT_SERVING, so on Kubernetes only the leader is ready behind the LCM's
Service.

Why followers do not serve deploys: the lifecycle's per-job locks and its
capacity reservation are in process memory, and the local and docker
backends keep their records (pids, attempt plans) in files under
`<state>/lcm/`; two replicas deploying at once could start one attempt
twice or spend the same capacity. A deposed leader closes its lifecycle
(stops supervising) and refuses calls from then on; the learners, monitors
and records stay for the next leader to adopt.

Fencing: a leader can be deposed without knowing it yet (paused, then
resumed after its lease ran out while a follower took over). Its lifecycle
therefore writes to etcd only through a `FencedCoordinator`
(services/common/adapters/etcd.py): every write (attempt and halt keys,
lost-controller reports, an elastic slot's status, a job's cleanup and its
killed mark) is a transaction that also compares the election key's create
revision with this leader's term, and the lifecycle confirms that fence
before it acts on the backend (deploy, kill, growth, a monitor's restart).
The first refusal deposes the replica at once, and its calls answer as a
follower's.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

from trainforge_services.common.adapters.etcd import Coordinator, FenceRefused
from trainforge_services.common.election import FOLLOWING, Election
from trainforge_services.common.errors import Unavailable, message_of
from trainforge_services.lcm.backends.base import Capacity, Handle, JobDeployment, JobView, TeamQuota
from trainforge_services.lcm.lifecycle import LifecycleManager, RunningJob

log = logging.getLogger(__name__)

SERVICE = "lcm"
T = TypeVar("T")


class LeaderLifecycle:
    """The lifecycle's face for the gRPC API (grpc_api.py): the elected replica's `LifecycleManager`, or a refusal."""

    def __init__(self, build: Callable[[Coordinator], LifecycleManager], coordinator: Coordinator, *, backend: str,
                 ttl: int, address: str):
        self._build, self._coord, self.name = build, coordinator, backend
        self.identity = f"{socket.gethostname()}:{os.getpid()}@{address}"
        self._current: LifecycleManager | None = None
        self._lock = threading.Lock()
        # told whether this replica serves the LCM's calls (its gRPC health: Kubernetes routes to the ready one)
        self.on_change: Callable[[bool], None] = lambda serving: None
        self.election = Election(coordinator, SERVICE, ttl=ttl, identity=self.identity,
                                 on_elected=self._elected, on_deposed=self._deposed)

    def start(self) -> LeaderLifecycle:
        self.election.start()
        return self

    @property
    def coordinator(self) -> Coordinator:
        return self._coord

    def _elected(self, term: int) -> None:
        try:
            # every etcd write of this lifecycle is fenced on this term; reconciles before serving a call
            lifecycle = self._build(self._coord.fenced(self.election.key, term, self.election.resign))
        except Exception as e:  # noqa: BLE001 - a leader that cannot lead must let another one try
            log.warning("lcm: could not take over as term %d: %s; resigning", term, message_of(e))
            self.election.resign()
            return
        with self._lock:
            self._current = lifecycle
        self.on_change(True)
        log.info("lcm: leading as term %d; adopted %d running job(s)", term, len(lifecycle.running_jobs()))

    def _deposed(self) -> None:
        with self._lock:
            lifecycle, self._current = self._current, None
        self.on_change(False)
        if lifecycle is not None:
            lifecycle.close()
        log.info("lcm: following; the elected replica deploys and supervises")

    def _leader(self) -> LifecycleManager:
        lifecycle = self._current
        if lifecycle is None or not self.election.leading:
            raise Unavailable(f"LCM {FOLLOWING} ({self.identity}); the elected replica serves this call")
        return lifecycle

    # -- what the gRPC API and the metrics call ------------------------------------------

    def _as_leader(self, call: Callable[[LifecycleManager], T]) -> T:
        try:
            return call(self._leader())
        except FenceRefused as e:  # deposed while serving it: the caller asks the next replica
            raise Unavailable(f"LCM {FOLLOWING} ({self.identity}): {e.message}") from None

    def deploy(self, job: JobDeployment) -> list[Handle]:
        return self._as_leader(lambda lc: lc.deploy(job))

    def kill(self, job_id: str, attempt: int = 0) -> int:
        return self._as_leader(lambda lc: lc.kill(job_id, attempt))

    def halt(self, job_id: str, attempt: int) -> None:
        self._as_leader(lambda lc: lc.halt(job_id, attempt))

    def open_gate(self, job_id: str, attempt: int) -> None:
        self._as_leader(lambda lc: lc.open_gate(job_id, attempt))

    def grow(self, job_id: str, attempt: int, learners: int) -> bool:
        return self._as_leader(lambda lc: lc.grow(job_id, attempt, learners))

    def capacity(self) -> Capacity:
        return self._as_leader(lambda lc: lc.capacity())

    def sync_team(self, team: str, quota: TeamQuota) -> bool:
        return self._as_leader(lambda lc: lc.sync_team(team, quota))

    def view(self, job_id: str) -> JobView | None:
        return self._as_leader(lambda lc: lc.view(job_id))

    def running_jobs(self) -> list[RunningJob]:
        lifecycle = self._current
        return lifecycle.running_jobs() if lifecycle is not None else []

    def close(self) -> None:
        self.election.stop(resign=True)
        self._coord.close()

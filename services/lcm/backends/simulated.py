"""The simulated backend (`TF_BACKEND=simulated`): jobs that run for a set time and start no process.

For scale tests only (bench/scale_sim.py): it lets the real Trainer, LCM,
store and etcd carry thousands of jobs on a machine that could not run
them. A launched attempt is kept in memory; it plays what its controllers
and its job monitor would do, through the same contracts:

- at launch each rank's `learners/<rank>/status` is written to etcd as
  LEARNER_RUNNING, then the Trainer hears RUNNING (ReportJobStatus, actor
  "simulated");
- `sim_seconds` (TF_SIM_SECONDS; a job's own `env: {SIM_SECONDS: ...}`
  overrides it) after RUNNING was delivered, each rank's
  status becomes LEARNER_COMPLETED and the Trainer hears STORING, then
  COMPLETED; if the LCM asked the attempt to halt by then (its `halt` key),
  each rank's status becomes LEARNER_HALTED (with no checkpoint) and the
  Trainer hears HALTED instead;
- once the last report is delivered the attempt's processes read as ended
  and its monitor as done, as a real attempt's would.

A report the Trainer cannot take now is retried after `RETRY` seconds, in
order per job; one it refuses for good is logged and the attempt ends.
`stop` forgets a job at once (nothing more is reported for it). Capacity
comes from the `sim_*` settings. Nothing survives an LCM restart: the
attempts were only in this process's memory.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from trainforge_protos import trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import rpc
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.contracts.etcd import HaltRequest, LearnerStatus
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.settings import LcmSettings
from trainforge_services.common.states import JobState, LearnerState
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

log = logging.getLogger(__name__)

ACTOR = "simulated"
RETRY = 0.5
WORKERS = 8
SECONDS_ENV = "SIM_SECONDS"


@dataclass
class _Attempt:
    plan: AttemptPlan
    handles: list[Handle]
    done: bool = False
    sent: list[JobState] = field(default_factory=list)


class SimulatedBackend(Backend):
    name = "simulated"

    def __init__(self, settings: LcmSettings, *, coordinator: Coordinator | None = None):
        self._settings = settings
        self._work = Path(settings.state_dir).resolve() / "work"
        self._coord = coordinator or Coordinator(settings.etcd_endpoints, settings.etcd_prefix)
        self._own_coord = coordinator is None
        self._channel = rpc.channel(settings.trainer_address)
        self._trainer = trainer_pb2_grpc.TrainerStub(self._channel)
        self._lock = threading.Lock()
        self._jobs: dict[str, _Attempt] = {}
        self._due: list[tuple[float, int, str, int]] = []  # (when, seq, job, attempt): the attempt's next step
        self._seq = itertools.count()
        self._wake = threading.Condition(self._lock)
        self._stopping = False
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="sim-step")
        self._timer = threading.Thread(target=self._loop, name="sim-timer", daemon=True)
        self._timer.start()

    # -- Backend -----------------------------------------------------------------

    def site(self, job_id: str, attempt: int) -> Site:
        return Site(attempt_dir=self._work / job_id / str(attempt), master_addr="127.0.0.1", master_port=29500)

    def launch(self, plan: AttemptPlan) -> list[Handle]:
        handles = [Handle(Role.MONITOR, f"sim-{plan.job_id}-{plan.attempt}")]
        handles += [Handle(Role.CONTROLLER, f"sim-{plan.job_id}-{plan.attempt}-{r}", r)
                    for r in range(plan.world_size)]
        with self._lock:
            self._jobs[plan.job_id] = _Attempt(plan, handles)
            self._schedule(0.0, plan.job_id, plan.attempt)
        return handles

    def launch_learners(self, plan: AttemptPlan, ranks: list[int]) -> list[Handle]:
        with self._lock:
            sim = self._jobs.get(plan.job_id)
            added = [Handle(Role.CONTROLLER, f"sim-{plan.job_id}-{plan.attempt}-{r}", r) for r in ranks]
            if sim is not None and sim.plan.attempt == plan.attempt:
                sim.plan = plan
                sim.handles += [h for h in added if h not in sim.handles]
        return added

    def stop(self, job_id: str) -> int:
        with self._lock:
            sim = self._jobs.pop(job_id, None)
        return 0 if sim is None or sim.done else len(sim.handles)

    def observe(self, plan: AttemptPlan) -> JobView:
        with self._lock:
            sim = self._jobs.get(plan.job_id)
            if sim is None or sim.plan.attempt != plan.attempt:
                return JobView(plan.job_id)
            return JobView(plan.job_id, tuple(Observed(h, not sim.done) for h in sim.handles), monitor_done=sim.done)

    def restart_monitor(self, plan: AttemptPlan) -> Handle:
        # the simulated monitor lives in this process: it is gone only with the attempt (stop)
        return Handle(Role.MONITOR, f"sim-{plan.job_id}-{plan.attempt}")

    def capacity(self) -> Capacity:
        s = self._settings
        return Capacity(backend=self.name, gpus=s.sim_gpus, cpus=s.sim_cpus, memory=s.sim_memory,
                        max_learners=s.sim_max_learners)

    def close(self) -> None:
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
        self._timer.join(5)
        self._pool.shutdown(wait=True)
        self._channel.close()
        if self._own_coord:
            self._coord.close()

    # -- the simulated controllers and monitor -------------------------------------

    def _schedule(self, delay: float, job_id: str, attempt: int) -> None:
        """The attempt's next step in `delay` seconds; the caller holds the lock."""
        heapq.heappush(self._due, (time.monotonic() + delay, next(self._seq), job_id, attempt))
        self._wake.notify()

    def _loop(self) -> None:
        with self._lock:
            while not self._stopping:
                now = time.monotonic()
                if self._due and self._due[0][0] <= now:
                    _, _, job_id, attempt = heapq.heappop(self._due)
                    self._pool.submit(self._step, job_id, attempt)
                    continue
                self._wake.wait(self._due[0][0] - now if self._due else None)

    def _current(self, job_id: str, attempt: int) -> _Attempt | None:
        with self._lock:
            sim = self._jobs.get(job_id)
        return sim if sim is not None and sim.plan.attempt == attempt and not sim.done else None

    def _step(self, job_id: str, attempt: int) -> None:
        """Take the attempt one step on: start it, or end it; a report refused for now is tried again later."""
        sim = self._current(job_id, attempt)
        if sim is None:
            return  # stopped, or a newer attempt
        try:
            if not sim.sent:
                self._put_statuses(sim, LearnerState.LEARNER_RUNNING)
                self._report(sim, JobState.RUNNING, "every learner started (simulated)")
                delay = self._seconds(sim.plan)
            else:
                self._end(sim)
                return
        except Unavailable as e:
            log.info("job %s attempt %d: simulated step waits: %s", job_id, attempt, e.message)
            delay = RETRY
        except Exception:
            log.exception("job %s attempt %d: simulated step failed; the attempt ends", job_id, attempt)
            self._finish(sim)
            return
        with self._lock:
            if self._jobs.get(job_id) is sim:
                self._schedule(delay, job_id, attempt)

    def _seconds(self, plan: AttemptPlan) -> float:
        """How long the attempt runs: its manifest's SIM_SECONDS, else the setting."""
        own = plan.manifest.env.get(SECONDS_ENV)
        try:
            return max(0.0, float(own)) if isinstance(own, str) else self._settings.sim_seconds
        except ValueError:
            log.warning("job %s: %s=%r is not a number of seconds; using %g", plan.job_id, SECONDS_ENV, own,
                        self._settings.sim_seconds)
            return self._settings.sim_seconds

    def _end(self, sim: _Attempt) -> None:
        plan = sim.plan
        halt = HaltRequest.parse_or_none(self._coord.get(self._coord.keys.halt(plan.job_id))[0])
        if halt is not None and halt.attempt == plan.attempt:
            self._put_statuses(sim, LearnerState.LEARNER_HALTED)
            self._report(sim, JobState.HALTED, "every learner halted (simulated, no checkpoint)")
        else:
            self._put_statuses(sim, LearnerState.LEARNER_COMPLETED)
            self._report(sim, JobState.STORING, "every learner exited 0; storing outputs (simulated)")
            self._report(sim, JobState.COMPLETED, "completed (simulated)")
        self._finish(sim)

    def _finish(self, sim: _Attempt) -> None:
        with self._lock:
            sim.done = True

    def _put_statuses(self, sim: _Attempt, state: LearnerState) -> None:
        plan = sim.plan
        exit_code = 0 if state == LearnerState.LEARNER_COMPLETED else None
        for rank in range(plan.world_size):
            status = LearnerStatus(state=state, attempt=plan.attempt, exit_code=exit_code, isolation="none")
            self._coord.put(self._coord.keys.learner_status(plan.job_id, rank), status.value())

    def _report(self, sim: _Attempt, state: JobState, reason: str) -> None:
        """Tell the Trainer, once per state per attempt (a retried step skips what was delivered)."""
        if state in sim.sent:
            return
        plan = sim.plan
        rpc.call(self._trainer.ReportJobStatus, trainer_pb2.ReportJobStatusRequest(
            job_id=plan.job_id, attempt=plan.attempt, state=state, reason=reason, actor=ACTOR), 10.0)
        sim.sent.append(state)

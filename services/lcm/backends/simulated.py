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
comes from the `sim_*` settings.

An attempt outlives its LCM as a real one's processes do: its plan, when
RUNNING was delivered and which states were delivered are kept in
`<attempt dir>/simulated.json` (written atomically after each step), so the
next LCM (a restarted one, or the replica elected after the leader died)
adopts it when its lifecycle observes the attempt and plays the rest from
where it was: a job that was to end 5 s after RUNNING still ends then. A
state delivered just before the LCM died may be delivered once more (the
Trainer takes a repeated report as it takes a real monitor's). Each launch
appends `job attempt` to `<state>/work/simulated-launches.log`, so a scale
or failover test can count launches per attempt across LCM replicas.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from trainforge_protos import trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import rpc, rpcauth
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.contracts.etcd import HaltRequest, LearnerStatus
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.loop import Loop
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
# How often the step timer looks at an empty schedule (a scheduled step wakes it at once)
IDLE_SECONDS = 60.0
WORKERS = 8
SECONDS_ENV = "SIM_SECONDS"
RECORD = "simulated.json"
LAUNCHES = "simulated-launches.log"


@dataclass
class _Attempt:
    plan: AttemptPlan
    handles: list[Handle]
    done: bool = False
    sent: list[JobState] = field(default_factory=list)
    running_at: float | None = None  # wall-clock time RUNNING was delivered

    def record(self) -> str:
        return json.dumps({"plan": self.plan.model_dump(mode="json"), "done": self.done,
                           "sent": [s.name for s in self.sent], "running_at": self.running_at})


def _handles(plan: AttemptPlan) -> list[Handle]:
    return [Handle(Role.MONITOR, f"sim-{plan.job_id}-{plan.attempt}"),
            *(Handle(Role.CONTROLLER, f"sim-{plan.job_id}-{plan.attempt}-{r}", r) for r in range(plan.world_size))]


class SimulatedBackend(Backend):
    name = "simulated"

    def __init__(self, settings: LcmSettings, *, coordinator: Coordinator | None = None):
        self._settings = settings
        self._work = Path(settings.state_dir).resolve() / "work"
        self._coord = coordinator or Coordinator.of(settings)
        self._own_coord = coordinator is None
        self._channel = rpc.channel(settings.trainer_address, authorization=rpcauth.service_authorization(settings))
        self._trainer = trainer_pb2_grpc.TrainerStub(self._channel)
        self._lock = threading.Lock()
        self._jobs: dict[str, _Attempt] = {}
        # attempts this backend launched, adopted or stopped: only the others are adopted from their records
        self._seen: set[tuple[str, int]] = set()
        self._due: list[tuple[float, int, str, int]] = []  # (when, seq, job, attempt): the attempt's next step
        self._seq = itertools.count()
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="sim-step")
        self._timer = Loop("sim-timer", self._submit_due, interval=IDLE_SECONDS)
        self._timer.start()

    # -- Backend -----------------------------------------------------------------

    def site(self, job_id: str, attempt: int) -> Site:
        return Site(attempt_dir=self._work / job_id / str(attempt), master_addr="127.0.0.1", master_port=29500)

    def launch(self, plan: AttemptPlan) -> list[Handle]:
        sim = _Attempt(plan, _handles(plan))
        self._save(sim)
        self._work.mkdir(parents=True, exist_ok=True)
        with (self._work / LAUNCHES).open("a") as f:
            f.write(f"{plan.job_id} {plan.attempt}\n")
        with self._lock:
            self._jobs[plan.job_id] = sim
            self._seen.add((plan.job_id, plan.attempt))
            self._schedule(0.0, plan.job_id, plan.attempt)
        return list(sim.handles)

    def launch_learners(self, plan: AttemptPlan, ranks: list[int]) -> list[Handle]:
        with self._lock:
            sim = self._jobs.get(plan.job_id)
            added = [Handle(Role.CONTROLLER, f"sim-{plan.job_id}-{plan.attempt}-{r}", r) for r in ranks]
            if sim is not None and sim.plan.attempt == plan.attempt:
                sim.plan = plan
                sim.handles += [h for h in added if h not in sim.handles]
        if sim is not None:
            self._save(sim)
        return added

    def stop(self, job_id: str) -> int:
        with self._lock:
            sim = self._jobs.pop(job_id, None)
        job_dir = self._work / job_id
        stopped = 0
        for path in job_dir.glob(f"*/{RECORD}"):  # attempts a previous LCM left too
            with contextlib.suppress(ValueError), self._lock:
                self._seen.add((job_id, int(path.parent.name)))
            if sim is None:
                with contextlib.suppress(OSError, ValueError, KeyError):
                    stopped = max(stopped, 0 if json.loads(path.read_text())["done"] else 1)
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                path.parent.rmdir()
        with contextlib.suppress(OSError):
            job_dir.rmdir()
        if sim is not None:
            return 0 if sim.done else len(sim.handles)
        return stopped

    def observe(self, plan: AttemptPlan) -> JobView:
        with self._lock:
            sim = self._jobs.get(plan.job_id)
        if sim is None or sim.plan.attempt != plan.attempt:
            sim = self._adopt(plan)
            if sim is None:
                return JobView(plan.job_id)
        with self._lock:
            return JobView(plan.job_id, tuple(Observed(h, not sim.done) for h in sim.handles), monitor_done=sim.done)

    def restart_monitor(self, plan: AttemptPlan) -> Handle:
        # the simulated monitor lives in this process: it is gone only with the attempt (stop)
        return Handle(Role.MONITOR, f"sim-{plan.job_id}-{plan.attempt}")

    def capacity(self) -> Capacity:
        s = self._settings
        return Capacity(backend=self.name, gpus=s.sim_gpus, cpus=s.sim_cpus, memory=s.sim_memory,
                        max_learners=s.sim_max_learners)

    def close(self) -> None:
        self._timer.stop(5)
        self._pool.shutdown(wait=True)
        self._channel.close()
        if self._own_coord:
            self._coord.close()

    # -- outliving the LCM ----------------------------------------------------------

    def _record_path(self, job_id: str, attempt: int) -> Path:
        return self.site(job_id, attempt).attempt_dir / RECORD

    def _save(self, sim: _Attempt) -> None:
        """The attempt's record, replaced atomically: what a successor LCM resumes from."""
        path = self._record_path(sim.plan.job_id, sim.plan.attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{RECORD}.{threading.get_ident()}")
        tmp.write_text(sim.record())
        os.replace(tmp, path)

    def _adopt(self, plan: AttemptPlan) -> _Attempt | None:
        """An attempt a previous LCM launched, taken over from its record; None when there is none."""
        try:
            saved = json.loads(self._record_path(plan.job_id, plan.attempt).read_text())
            sim = _Attempt(AttemptPlan.model_validate(saved["plan"]), [], done=bool(saved["done"]),
                           sent=[JobState[name] for name in saved["sent"]], running_at=saved["running_at"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError) as e:
            log.warning("job %s attempt %d: unreadable simulated record (%s); not adopted", plan.job_id,
                        plan.attempt, e)
            return None
        sim.handles = _handles(sim.plan)
        with self._lock:
            current = self._jobs.get(plan.job_id)
            if current is not None and current.plan.attempt == plan.attempt:
                return current  # adopted by a concurrent observe
            if (plan.job_id, plan.attempt) in self._seen or (current is not None and current.plan.attempt > plan.attempt):
                return None  # ours, and stopped or replaced since: never played again
            self._seen.add((plan.job_id, plan.attempt))
            self._jobs[plan.job_id] = sim
            if not sim.done:
                left = 0.0
                if JobState.RUNNING in sim.sent and sim.running_at is not None:
                    left = max(0.0, sim.running_at + self._seconds(sim.plan) - time.time())
                self._schedule(left, plan.job_id, plan.attempt)
        log.info("job %s attempt %d: adopted the simulated attempt (delivered: %s)", plan.job_id, plan.attempt,
                 ", ".join(s.name for s in sim.sent) or "nothing")
        return sim

    # -- the simulated controllers and monitor -------------------------------------

    def _schedule(self, delay: float, job_id: str, attempt: int) -> None:
        """The attempt's next step in `delay` seconds; the caller holds the lock."""
        heapq.heappush(self._due, (time.monotonic() + delay, next(self._seq), job_id, attempt))
        self._timer.wake()

    def _submit_due(self) -> float | None:
        """Hand the steps that are due to the pool; the seconds until the next one (None: none is waiting)."""
        with self._lock:
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                _, _, job_id, attempt = heapq.heappop(self._due)
                self._pool.submit(self._step, job_id, attempt)
            return self._due[0][0] - now if self._due else None

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
            if JobState.RUNNING not in sim.sent:
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
        if JobState.COMPLETED in sim.sent or JobState.HALTED in sim.sent:
            self._finish(sim)  # an adopted attempt whose end was delivered just before its LCM died
            return
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
        if self._is_current(sim):
            self._save(sim)

    def _is_current(self, sim: _Attempt) -> bool:
        """Whether `sim` is still this backend's attempt of its job (not stopped or replaced meanwhile): only then is its record saved."""
        with self._lock:
            return self._jobs.get(sim.plan.job_id) is sim

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
        if state == JobState.RUNNING:
            sim.running_at = time.time()
        if self._is_current(sim):
            self._save(sim)

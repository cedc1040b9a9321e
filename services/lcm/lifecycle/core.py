"""The LifecycleManager: one owner of every job attempt, whatever backend runs it.

It turns a validated request into an `AttemptPlan`, checks the backend has
room (learners and GPUs, counting the other attempts it runs or is
launching), writes the job's etcd `attempt` key (`AttemptInfo`) and, on a
halt, its `halt` key (`HaltRequest`), and removes the job's etcd prefix when
an attempt is replaced or the job is killed. Deploys are idempotent per
(job, attempt); an older attempt than the recorded one is a Conflict; a
newer one replaces it. A removed attempt stays marked killed for a while
(`marks.py`), so its deploy arriving late is a Conflict too.

Its records (`records.py`) survive an LCM restart; the next LCM reconciles
them with what the backend observes (`reconcile`): an attempt with
something running, whose monitor never delivered its last state, or that
ran to its end (until its KillJob) is adopted; the rest (a launch cut short)
forgotten. The supervision pass (`supervision.py`) reports
lost controllers and starts dead monitors again.

An elected LCM replica passes a fenced coordinator (services/lcm/replicas.py):
its etcd writes are refused once it is deposed, and each operation confirms
the fence before it touches the backend (`Coordinator.confirm`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from trainforge_services.common.adapters.etcd import Coordinator, FenceRefused
from trainforge_services.common.contracts.etcd import AttemptInfo, GateOpen, HaltRequest
from trainforge_services.common.contracts.ids import check_job_id
from trainforge_services.common.errors import Conflict, ResourceExhausted
from trainforge_services.common.loop import Loop
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.backends.base import (
    AttemptPlan,
    Backend,
    Capacity,
    Handle,
    JobDeployment,
    JobView,
    TeamQuota,
)
from trainforge_services.lcm.lifecycle.credentials import Credentials
from trainforge_services.lcm.lifecycle.elastic import Growth, Room, open_slots, quota_room
from trainforge_services.lcm.lifecycle.issuers import job_credentials
from trainforge_services.lcm.lifecycle.marks import KilledMarks
from trainforge_services.lcm.lifecycle.plan import build_plan, check_attempt
from trainforge_services.lcm.lifecycle.records import AttemptRecord, attempt_records
from trainforge_services.lcm.lifecycle.supervision import Supervision, launched, unfinished
from trainforge_services.lcm.lifecycle.types import RunningJob

log = logging.getLogger(__name__)

START_TIMEOUT = 300.0
KILLED_TTL = 3600
SUPERVISE_INTERVAL = 2.0


class LifecycleManager:
    """Deploy, kill, halt and supervise job attempts on one backend."""

    def __init__(self, backend: Backend, coordinator: Coordinator, state_dir: str | Path, *, lease_ttl: int = 10,
                 start_timeout: float = START_TIMEOUT, supervise_interval: float = SUPERVISE_INTERVAL,
                 killed_ttl: int = KILLED_TTL, own_coordinator: bool = False, credentials: Credentials | None = None):
        self.backend = backend
        self._credentials = credentials or Credentials()
        self._coord = coordinator
        self._keys = coordinator.keys
        self._own_coordinator = own_coordinator
        self._lease_ttl = lease_ttl
        self._start_timeout = start_timeout
        self._marks = KilledMarks(coordinator, killed_ttl)
        self._records = attempt_records(Path(state_dir).resolve())
        self._lock = threading.Lock()
        self._job_locks: dict[str, threading.Lock] = {}
        self._launching: set[str] = set()
        attach = self._credentials.attach
        self._supervision = Supervision(backend, coordinator, self._records, self._job_lock, attach)
        self._growth = Growth(backend, coordinator, self._records, self._job_lock, self.room, attach)
        self.reconcile()
        self._supervisor = Loop("lcm-supervisor", self._supervise, interval=supervise_interval)
        # the first pass comes one interval after the start: `reconcile` has just looked at every attempt
        self._supervisor.start(at_once=False)

    @classmethod
    def from_settings(cls, settings: LcmSettings, backend: Backend, coordinator: Coordinator | None = None,
                      **kw) -> LifecycleManager:
        """A lifecycle manager on `backend` minting what `job_credentials` says; it closes only its own coordinator."""
        own, coord = coordinator is None, coordinator or Coordinator.of(settings)
        kw.setdefault("credentials", job_credentials(settings, coord))
        return cls(backend, coord, settings.state_dir, lease_ttl=settings.lease_ttl,
                   killed_ttl=settings.killed_ttl, own_coordinator=own, **kw)

    @property
    def name(self) -> str:
        return self.backend.name

    def _job_lock(self, job_id: str) -> threading.Lock:
        with self._lock:
            return self._job_locks.setdefault(job_id, threading.Lock())

    # -- restart --------------------------------------------------------------------

    def reconcile(self) -> None:
        """Take over a previous LCM's records: adopt attempts still running, not yet reported, or ended (kept until
        their KillJob, so a resent deploy runs nothing again); stop and forget the rest (launches cut short).

        Attempts the backend finds on its own (`recover`, e.g. by label) that no record names are recorded
        first, so an LCM that lost its state directory adopts them too.
        """
        self._coord.confirm()
        known = {r.job_id for r in self._records.load()}
        for plan in self.backend.recover():
            if plan.job_id not in known:
                self._records.put(AttemptRecord(plan=plan))
                known.add(plan.job_id)
        for record in self._records.load():
            view = self.backend.observe(record.plan)
            if view.alive:
                # (one marked `killing` too: the Trainer asks again until its KillJob succeeds)
                log.info("adopted job %s attempt %d: %s", record.job_id, record.attempt,
                         ", ".join(map(str, view.handles)))
            elif unfinished(record, view):
                # everything died while no LCM watched (e.g. its monitor was killed and the learners
                # finished): supervision starts the monitor again, which reports from etcd
                log.info("adopted job %s attempt %d: nothing runs but its monitor never finished",
                         record.job_id, record.attempt)
            elif launched(record, view):
                # it ran to its end (e.g. while the LCM's replicas changed leader): kept until its KillJob, so
                # a deploy of this attempt resent late is answered from it and never runs the attempt again
                log.info("adopted job %s attempt %d: it ended; its monitor delivered the end", record.job_id,
                         record.attempt)
            elif record.killing:
                # a kill (or a replacement by a later attempt) cut short: finished, so the attempt is marked
                # killed as well; a launch cut short that was being redone is only cleared (asked again, it runs)
                self._remove(record, mark=not record.redoing)
                log.info("finished removing job %s attempt %d", record.job_id, record.attempt)
            else:
                self.backend.stop(record.job_id)
                self._records.forget(record.job_id)
                log.info("forgot job %s attempt %d: none of its processes runs", record.job_id, record.attempt)

    # -- deploy ---------------------------------------------------------------------

    def deploy(self, job: JobDeployment) -> list[Handle]:
        """Start the attempt's monitor and learners; their handles.

        Idempotent per (job, attempt): a repeated call while they run (or while
        its monitor has yet to deliver the end) starts nothing but a dead
        monitor, and returns the same handles; one after the attempt ended
        starts nothing at all. A launch cut short is redone. A later attempt
        replaces an earlier one; an earlier attempt than the recorded one, or
        one no later than the last killed (the job's `killed` key), is a
        Conflict.
        """
        with self._job_lock(job.job_id):
            self._coord.confirm()  # a deposed leader starts and stops nothing
            existing = self._check_order(job)
            if existing is not None:
                view = self.backend.observe(existing.plan)
                if job.attempt == existing.attempt and launched(existing, view):
                    return self._answer_resent(existing, view)
                self._replace(existing, job)
            plan = self._reserve(job)
            return self._launch(plan)

    def _check_order(self, job: JobDeployment) -> AttemptRecord | None:
        """The job's recorded attempt, if any; a Conflict when `job` is older than it or than the last killed."""
        existing = self._records.get(job.job_id)
        if existing is not None and job.attempt < existing.attempt:
            raise Conflict(f"job {job.job_id}: attempt {job.attempt} is older than the deployed "
                           f"attempt {existing.attempt}")
        killed = self._marks.highest(job.job_id)
        if killed >= job.attempt:
            log.info("job %s attempt %d refused: attempt %d was killed", job.job_id, job.attempt, killed)
            raise Conflict(f"job {job.job_id} attempt {killed} was killed; a new run needs attempt {killed + 1}"
                           + (f" (asked: attempt {job.attempt})" if job.attempt != killed else ""))
        return existing

    def _answer_resent(self, existing: AttemptRecord, view: JobView) -> list[Handle]:
        """A deploy of the attempt that is deployed already: never a second run of it.

        A dead monitor is started again and reports what became of it; an attempt whose monitor delivered its
        end is over (the Trainer runs a job again only as a later attempt), and a deploy resent after that (its
        check of the job's state came first) starts nothing. The handles are those `view` saw, or, once a monitor
        was started again, what the backend sees now.
        """
        if view.monitor_done and not view.alive:
            log.info("job %s attempt %d already ran to its end; nothing started", existing.job_id,
                     existing.attempt)
            return view.handles
        log.info("job %s attempt %d already deployed", existing.job_id, existing.attempt)
        if self._supervision.revive_monitor(existing, view, spaced=False):
            return self.backend.observe(existing.plan).handles
        return view.handles

    def _replace(self, existing: AttemptRecord, job: JobDeployment) -> None:
        """Remove the recorded attempt for `job`'s: a later one, or the same one whose launch was cut short."""
        log.info("job %s: replacing attempt %d with attempt %d", job.job_id, existing.attempt, job.attempt)
        # the same attempt again (a launch cut short, redone) is not marked killed: it is what runs next
        self._remove(existing, mark=job.attempt > existing.attempt)

    def _others(self, job_id: str) -> list[AttemptRecord]:
        """The other attempts holding resources (the caller holds `_lock`): running, or being launched on
        another thread (an attempt holds its share before anything of it runs)."""
        return [r for r in self._records.all() if r.job_id != job_id
                and (r.job_id in self._launching or self.backend.observe(r.plan).alive)]

    def room(self, record: AttemptRecord) -> Room:
        """What is free for the attempt of `record` to grow into (lifecycle/elastic.py)."""
        cap = self.backend.capacity()
        with self._lock:
            others = self._others(record.job_id)
        plan = record.plan
        live = plan.manifest.max_learners - len(open_slots(plan, self.backend.observe(plan)))
        used = {g for r in others for g in r.plan.all_gpus} | plan.all_gpus
        held = [(r.plan.manifest, r.plan.world_size) for r in others if r.plan.team == plan.team]
        return Room(learners=cap.max_learners - sum(r.plan.world_size for r in others) - live,
                    gpus=[g for g in range(cap.gpus) if g not in used],
                    quota=quota_room(plan.team_quota, plan.manifest, [*held, (plan.manifest, live)]))

    def _reserve(self, job: JobDeployment) -> AttemptPlan:
        """Check the backend has room, plan the attempt and record it (as launching) before anything starts.

        An elastic job starts with the minimum the Trainer admitted; it grows as the Trainer grants more
        (lifecycle/elastic.py).
        """
        cap = self.backend.capacity()
        with self._lock:
            others = self._others(job.job_id)
            running = sum(r.plan.world_size for r in others)
            if running + job.world_size > cap.max_learners:
                raise ResourceExhausted(f"needs {job.world_size} learner(s); the {cap.backend} backend runs at most "
                                        f"{cap.max_learners} and {running} are running")
            used = {g for r in others for g in r.plan.all_gpus}
            free = [g for g in range(cap.gpus) if g not in used]
            if job.gpus > len(free):
                raise ResourceExhausted(f"needs {job.gpus} GPU(s); the {cap.backend} backend has {len(free)} of "
                                        f"{cap.gpus} free")
            size = job.world_size
            plan = build_plan(job, self.backend.site(job.job_id, job.attempt),
                              free[:size * job.manifest.resources.gpus], lease_ttl=self._lease_ttl,
                              start_timeout=self._start_timeout, size=size)
            self._records.put(AttemptRecord(plan=plan))
            self._launching.add(job.job_id)
            return plan

    def _launch(self, plan: AttemptPlan) -> list[Handle]:
        """Write the job's etcd `attempt` key and start the reserved plan; a launch that fails is stopped and
        forgotten (one refused by the fence only forgotten: the next leader deploys it)."""
        try:
            self._coord.put(self._keys.attempt(plan.job_id), AttemptInfo(
                attempt=plan.attempt, learners=plan.world_size, checkpoint_uri=plan.checkpoint_uri).value())
            handles = self.backend.launch(self._credentials.attach(plan))
        except FenceRefused:
            self._records.forget(plan.job_id)
            raise
        except BaseException:
            self.backend.stop(plan.job_id)
            self._records.forget(plan.job_id)
            raise
        finally:
            with self._lock:
                self._launching.discard(plan.job_id)
        log.info("job %s attempt %d deployed: %s", plan.job_id, plan.attempt, ", ".join(map(str, handles)))
        return handles

    def grow(self, job_id: str, attempt: int, learners: int) -> bool:
        """The Trainer grants the elastic attempt up to `learners` learners (growth fills slots that far).

        False when no such attempt is recorded (ended, replaced, or not deployed yet). Idempotent.
        """
        check_job_id(job_id)
        check_attempt(attempt)
        with self._job_lock(job_id):
            record = self._records.get(job_id)
            if record is None or record.attempt != attempt or record.killing or not record.plan.manifest.elastic:
                return False
            granted = min(learners, record.plan.manifest.max_learners)
            if granted > record.granted:
                self._coord.confirm()
                self._records.put(record.model_copy(update={"granted": granted}))
                log.info("job %s attempt %d: granted %d learner(s)", job_id, attempt, granted)
            return True

    # -- kill and halt ----------------------------------------------------------------

    def _remove(self, record: AttemptRecord | None, job_id: str = "", *, mark: bool = True,
                named: int = 0) -> int:
        """Mark the record `killing`, stop everything of the job, clear its etcd keys and mark its attempt
        killed (one transaction, `marks.py`), forget it. How many processes were still running.

        The attempt marked is the highest of `named` (the attempt the KillJob names; 0: none), the record's
        and the one the job's etcd `attempt` key names, if any (a record may be missing: a repeated KillJob,
        a state directory lost, or a deploy that has not arrived yet); the mark never goes down.
        `mark=False`: a launch cut short, cleared to be redone as the same attempt.
        """
        job_id = record.job_id if record else job_id
        if record is not None and not record.killing:
            self._records.put(record.model_copy(update={"killing": True, "redoing": not mark}))
        killed = self.backend.stop(job_id)
        self._marks.clear(job_id, max(named, record.attempt if record else 0), mark=mark)
        self._records.forget(job_id)
        # last, once nothing of the job runs: a failure fails the KillJob, which is asked again
        self._credentials.revoke(job_id)
        return killed

    def mark_killing(self, job_id: str) -> None:
        """Record that the job is being removed (what `kill` does first; tests use it to crash halfway)."""
        record = self._records.get(job_id)
        if record is not None and not record.killing:
            self._records.put(record.model_copy(update={"killing": True}))

    def kill(self, job_id: str, attempt: int = 0) -> int:
        """Stop and remove everything of a job, all attempts, and its etcd keys. Idempotent.

        `attempt`: the job's current attempt as the caller knows it (0: not known); it is marked killed even
        when nothing of the job is here yet, so its deploy, arriving later, is refused (a Conflict).
        Returns how many processes (or pods) were still running.
        """
        check_job_id(job_id)
        if attempt:
            check_attempt(attempt)
        with self._job_lock(job_id):
            self._coord.confirm()
            killed = self._remove(self._records.get(job_id), job_id, named=attempt)
        log.info("job %s killed: %d process(es) were running", job_id, killed)
        return killed

    def halt(self, job_id: str, attempt: int) -> None:
        """Ask an attempt's learners to checkpoint and exit: the job's `halt` key (docs/CONTRACTS.md).

        Idempotent; a halt for an attempt that no longer runs is ignored by
        every controller (they compare the attempt).
        """
        check_job_id(job_id)
        check_attempt(attempt)
        self._coord.put(self._keys.halt(job_id), HaltRequest(attempt=attempt).value())

    def open_gate(self, job_id: str, attempt: int) -> None:
        """Let a gated job's learners start: the job's `gate` key (docs/CONTRACTS.md). Idempotent.

        Written only where none is (a create), so a repeated call wakes no controller's watch again. A gate
        written before a newer attempt's deploy replaced the old one is deleted with the job's keys; the
        Trainer opens it again once that deploy answered (services/trainer/lcmcalls.py).
        """
        check_job_id(job_id)
        check_attempt(attempt)
        self._coord.create(self._keys.gate(job_id), GateOpen(attempt=attempt).value())

    # -- observation ------------------------------------------------------------------

    def capacity(self) -> Capacity:
        """The backend's total resources (not what is free: the Trainer accounts for usage)."""
        return self.backend.capacity()

    def sync_team(self, team: str, quota: TeamQuota) -> bool:
        """A team's quota changed: the backend's copy follows (False: the backend keeps none)."""
        return self.backend.mirror_quota(team, quota)

    def view(self, job_id: str) -> JobView | None:
        record = self._records.get(job_id)
        return self.backend.observe(record.plan) if record else None

    @property
    def coordinator(self) -> Coordinator:
        return self._coord

    def running_jobs(self) -> list[RunningJob]:
        """Attempts with something still running."""
        out = []
        for record in self._records.all():
            view = self.backend.observe(record.plan)
            if view.alive:
                out.append(RunningJob(record.job_id, record.attempt, record.plan.world_size, view.handles))
        return out

    # -- supervision ------------------------------------------------------------------

    def _supervise(self) -> None:
        try:
            self.supervise_once()
        except FenceRefused as e:
            log.warning("supervision stopped: %s", e.message)
            self._supervisor.stop()  # deposed: this replica supervises nothing more

    def supervise_once(self) -> None:
        """One look at every attempt: restart dead monitors, report lost controllers, grow elastic jobs."""
        self._coord.confirm()
        self._supervision.run_once()
        self._growth.run_once()

    def close(self) -> None:
        """Stop supervising and release connections; running jobs are left running."""
        self._supervisor.stop(10)
        self.backend.close()
        if self._own_coordinator:
            self._coord.close()

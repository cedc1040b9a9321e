"""The embedded backend: every learner is a controller process on this machine.

Per attempt, `<state_dir>/work/<job>/<attempt>/` holds the spec files the
processes read (the plan's `LearnerSpec`s and `MonitorSpec`, docs/CONTRACTS.md),
their logs, and the learners' working directories. The processes get the
LCM's own TF_* settings in their environment, so an LCM built in a test
reaches the same etcd as its learners. Which processes were started is kept
in `ProcessRecords` so a restarted LCM sees them again. They are forked
from the backend's warm fork server (`forkclient.py`) when it can, else
spawned as fresh interpreters (`processes.spawn`); either way they are
recorded, found and stopped the same way.

Stopping a job stops more than the recorded processes: a learner whose
controller was SIGKILLed runs on as an orphan (the kernel's parent-death
signal reaches only the controller's direct child, e.g. the learner's
shell, not what that shell started), so `stop` also looks for every process
that carries the job's TF_JOB_ID and working directory, or that runs one of
the job's spec files. The monitor is stopped first, so it does not report
the learners it sees dying.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from trainforge_services.common import isolation, proctree
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.keys import MONITOR_DONE
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.backends.base import (
    SERVICE_KEYS,
    AttemptPlan,
    Backend,
    Capacity,
    Grant,
    Handle,
    JobView,
    Observed,
    Role,
    Site,
    process_name,
)
from trainforge_services.lcm.backends.local import forkclient, processes
from trainforge_services.lcm.backends.local.records import ProcessEntry, ProcessRecord, process_records
from trainforge_services.lcm.store import write_atomically

log = logging.getLogger(__name__)

# the platform's keys and the LCM's own login, which the fork server (and so every child's
# /proc/<pid>/environ) never holds: each fork takes the env of its request (its grant's)
SERVER_WITHHELD = frozenset({*SERVICE_KEYS, "TF_S3_ACCESS_KEY", "TF_S3_SECRET_KEY", "TF_ETCD_USER", "TF_ETCD_PASSWORD"})

KILL_GRACE = 10.0
_MODULES = {Role.MONITOR: "trainforge_services.jobmonitor", Role.CONTROLLER: "trainforge_services.controller"}
# what a controller imports on first use (the log-store client library, ~0.4-0.8 s of CPU; boto3 for an S3
# object store): the fork server imports it once, so its children do not
_WARM = ("trainforge_services.common.adapters.logstore",)
_WARM_S3 = "trainforge_services.common.adapters.objectstore.s3"


class LocalBackend(Backend):
    name = "local"

    def __init__(self, settings: LcmSettings, *, kill_grace: float = KILL_GRACE):
        self._settings = settings
        self._kill_grace = kill_grace
        self._python = settings.python or sys.executable
        self._gpus = settings.local_gpus if settings.local_gpus >= 0 else processes.detect_gpus()
        state = Path(settings.state_dir).resolve()
        self._work = state / "work"
        self._records = process_records(state)
        self._lock = threading.Lock()
        self._children: dict[int, subprocess.Popen] = {}
        self._forks = None
        if forkclient.enabled(settings.fork_server, settings.python):
            warm = (*_WARM, _WARM_S3) if settings.objectstore_url.startswith("s3:") else _WARM
            try:
                # no key or secret: each child gets its whole env with its request, and what the server started
                # with stays readable in every child's /proc/<pid>/environ (store keys a grant withholds)
                server_env = {k: v for k, v in processes.child_env(settings).items() if k not in SERVER_WITHHELD}
                self._forks = forkclient.ForkServer(self._python, state, server_env,
                                                    list(_MODULES.values()), warm)
            except OSError as e:
                log.warning("no fork server (%s): controllers and monitors are spawned", e)

    # -- processes ------------------------------------------------------------------

    def _reap(self) -> None:
        """Collect exited children so they do not linger as zombies."""
        with self._lock:
            for pid, popen in list(self._children.items()):
                if popen.poll() is not None:
                    del self._children[pid]

    @staticmethod
    def _spec_path(attempt_dir: Path, role: Role, rank: int | None) -> Path:
        return attempt_dir / ("monitor.json" if role is Role.MONITOR else f"learner-{rank}.json")

    def _spawn(self, record: ProcessRecord, role: Role, rank: int | None, grant: Grant) -> ProcessRecord:
        attempt_dir = record.attempt_dir
        name = process_name(role, rank)
        argv = [self._python, "-m", _MODULES[role], "--spec", str(self._spec_path(attempt_dir, role, rank))]
        # the platform's settings less what the job may not hold, plus the job's own credentials
        log_path, env = attempt_dir / f"{name}.log", grant.env_for(role, processes.child_env(self._settings))
        forked = self._forks.spawn(argv, attempt_dir, log_path, env) if self._forks else None
        if forked:
            pid, started = forked
        else:
            try:
                popen, started = processes.spawn(argv, attempt_dir, log_path, env)
            except OSError as e:
                raise TrainforgeError(f"cannot start the {role.value} of job {record.job_id} with {self._python}: "
                                      f"{e}") from None
            pid = popen.pid
            with self._lock:
                self._children[pid] = popen
        record = record.adding(ProcessEntry(role=role, rank=rank, pid=pid, started=started))
        self._records.put(record)
        return record

    # -- Backend --------------------------------------------------------------------

    def site(self, job_id: str, attempt: int) -> Site:
        return Site(attempt_dir=self._work / job_id / str(attempt), master_addr="127.0.0.1",
                    master_port=processes.free_port())

    def launch(self, plan: AttemptPlan) -> list[Handle]:
        attempt_dir = plan.attempt_dir
        attempt_dir.mkdir(parents=True, exist_ok=True)
        # a launch of this attempt that is redone must not inherit the marker of the one before
        (attempt_dir / MONITOR_DONE).unlink(missing_ok=True)
        write_atomically(self._spec_path(attempt_dir, Role.MONITOR, None), plan.monitor.to_json())
        for spec in plan.learners:
            spec.workdir.mkdir(parents=True, exist_ok=True)
            # 0600: a learner spec may carry the team secrets its env names
            write_atomically(self._spec_path(attempt_dir, Role.CONTROLLER, spec.rank), spec.to_json(), mode=0o600)
        record = ProcessRecord(job_id=plan.job_id, attempt=plan.attempt, attempt_dir=attempt_dir)
        self._records.put(record)
        record = self._spawn(record, Role.MONITOR, None, plan.grant)
        for spec in plan.learners:
            record = self._spawn(record, Role.CONTROLLER, spec.rank, plan.grant)
        return [e.handle for e in record.processes]

    def launch_learners(self, plan: AttemptPlan, ranks: list[int]) -> list[Handle]:
        record = self._records.get(plan.job_id)
        if record is None or record.attempt != plan.attempt:
            raise TrainforgeError(f"job {plan.job_id} attempt {plan.attempt} is not running here")
        handles = []
        for rank in ranks:
            spec = plan.learners[rank]
            spec.workdir.mkdir(parents=True, exist_ok=True)
            write_atomically(self._spec_path(plan.attempt_dir, Role.CONTROLLER, rank), spec.to_json(), mode=0o600)
            record = self._spawn(record.without_controller(rank), Role.CONTROLLER, rank, plan.grant)
            handles.append(record.processes[-1].handle)
        return handles

    def restart_monitor(self, plan: AttemptPlan) -> Handle:
        record = self._records.get(plan.job_id)
        if record is None or record.attempt != plan.attempt:
            record = ProcessRecord(job_id=plan.job_id, attempt=plan.attempt, attempt_dir=plan.attempt_dir)
        record = self._spawn(record.without(Role.MONITOR), Role.MONITOR, None, plan.grant)
        return record.processes[-1].handle

    def observe(self, plan: AttemptPlan) -> JobView:
        self._reap()
        record = self._records.get(plan.job_id)
        done = (plan.attempt_dir / MONITOR_DONE).exists()
        if record is None or record.attempt != plan.attempt:
            return JobView(job_id=plan.job_id, monitor_done=done)
        return JobView(job_id=plan.job_id, monitor_done=done, processes=tuple(
            Observed(e.handle, processes.running(e.pid, e.started) is not None) for e in record.processes))

    def stop(self, job_id: str) -> int:
        """SIGTERM the monitor, then the controllers (each its process group) and every other process of
        the job (orphaned learners, any attempt); SIGKILL what outlives the grace."""
        self._reap()
        record = self._records.get(job_id)
        entries = record.processes if record else ()
        under = record.attempt_dir if record else self._work / job_id
        leaders = {e.pid: processes.running(e.pid, e.started) for e in entries}
        alive = {pid for pid, proc in leaders.items() if proc is not None}
        monitors = [(e.pid, leaders[e.pid]) for e in entries if e.role is Role.MONITOR]
        controllers = [(e.pid, leaders[e.pid]) for e in entries if e.role is not Role.MONITOR]
        self._report(job_id, processes.stop_groups(monitors, under, grace=self._kill_grace))
        # One read of the process table (after the monitors went) answers the questions below: the controllers'
        # descendants, the job's other processes, the controllers' groups. Each used to read every process's
        # files again (psutil's process_iter, environ and children), ~30 ms of the LCM's CPU per job in a burst.
        rows = proctree.table()
        ours = set(proctree.with_descendants((p for _, p in controllers if p is not None), rows))
        orphans = [p for p in processes.job_processes(self._work / job_id, job_id, rows) if p.pid not in ours]
        if orphans:
            log.info("job %s: stopping %d process(es) no live controller watches: %s", job_id, len(orphans),
                     ", ".join(str(p.pid) for p in orphans))
        self._report(job_id, processes.stop_groups(controllers, under, grace=self._kill_grace, extra=orphans,
                                                   rows=rows))
        self._reap()
        # the job's network namespace and learner cgroups (services/controller/sandbox/), once its processes are gone
        isolation.remove_job(job_id)
        self._records.forget(job_id)
        return len(alive) + sum(p.pid not in alive for p in orphans)

    def _report(self, job_id: str, stopped: proctree.Stopped) -> None:
        if stopped.killed:
            log.warning("job %s: SIGKILL for %d process(es) that outlived %gs: %s", job_id, len(stopped.killed),
                        self._kill_grace, ", ".join(map(str, stopped.killed)))
        if stopped.survivors:
            log.error("job %s: processes survived SIGKILL: %s", job_id, ", ".join(map(str, stopped.survivors)))

    def capacity(self) -> Capacity:
        s = self._settings
        return Capacity(backend=self.name, gpus=self._gpus, cpus=float(s.local_cpus or os.cpu_count() or 1),
                        memory=int(s.local_memory or psutil.virtual_memory().total),
                        max_learners=s.local_max_learners)

    def close(self) -> None:
        """Release the fork server; monitors and controllers spawned from here outlive the backend by design.

        Those still running stay this process's children: a thread waits for them, so that one that ends while
        this process lives is collected rather than left a zombie (and its `Popen` is never dropped running)."""
        self._reap()
        with self._lock:
            left, self._children = list(self._children.values()), {}
        if left:
            # not a Loop: a one-shot wait on the processes left running
            threading.Thread(target=_wait_all, args=(left,), name="local-backend-reaper", daemon=True).start()
        if self._forks:
            self._forks.close()


def _wait_all(children: list[subprocess.Popen]) -> None:
    for popen in children:
        popen.wait()

"""The embedded backend: every learner is a controller process on this machine.

The LCM can restart while jobs run, so nothing here lives only in memory:
each deployment is recorded in `<state_dir>/lcm/jobs/<job>.json` (pids and
their start times, so a reused pid is never mistaken for ours), written
atomically before and after every process it starts. Controllers and job
monitors run in their own sessions, so an LCM restart leaves them running
and a new LCM adopts them from the records.

Per attempt, `<state_dir>/work/<job>/<attempt>/` holds the spec files the
processes read (docs/CONTRACTS.md), their logs, and the learners' working
directories. The processes get the LCM's own TF_* settings in their
environment, so an LCM built in a test reaches the same etcd as its learners.

A supervisor thread starts again a job monitor that died before it left
`monitor.done` in its attempt directory (it resumes from etcd), also for an
attempt whose every process died while no LCM was watching: the monitor,
not a second run of the same attempt, decides how it ended. A deploy that an
LCM crash cut short (fewer processes recorded than the attempt needs) is
redone when the Trainer asks again.

Killing a job stops more than the recorded processes: a learner whose
controller was SIGKILLed runs on as an orphan (the kernel's parent-death
signal reaches only the controller's direct child, e.g. the learner's
shell, not what that shell started), so `kill` also looks for every process
that carries the job's TF_JOB_ID and working directory, or that runs one of
the job's spec files. A record is marked `killing` before anything is
stopped, so an LCM that crashes halfway never revives what it was removing.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from services.common.adapters.etcd import Coordinator
from services.common.errors import Conflict, ResourceExhausted, TrainforgeError
from services.common.keys import MONITOR_DONE
from services.common.settings import LcmSettings, StoreSettings
from services.common.states import LearnerState
from services.lcm.backends.base import Backend, Capacity, JobDeployment, RunningJob, check_job_id

log = logging.getLogger(__name__)

KILL_GRACE = 10.0
START_TIMEOUT = 300.0
# How often the supervisor looks for dead job monitors, and the least time between two restarts of one.
SUPERVISE_INTERVAL = 2.0
RESPAWN_SPACING = 5.0
_POLL = 0.05
_FINAL_LEARNER = frozenset({LearnerState.LEARNER_COMPLETED, LearnerState.LEARNER_FAILED, LearnerState.LEARNER_HALTED})
# The project root: children import `services.*` from here even when not installed.
_ROOT = Path(__file__).resolve().parents[3]


def detect_gpus() -> int:
    """How many GPUs `nvidia-smi -L` lists; 0 without nvidia-smi or when it fails."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def child_env(settings: LcmSettings) -> dict[str, str]:
    """The environment of controllers and monitors: ours, with the LCM's settings spelled out."""
    env = dict(os.environ)
    for name in StoreSettings.model_fields:
        env[f"TF_{name.upper()}"] = _env_value(getattr(settings, name))
    env["TF_LEASE_TTL"] = str(settings.lease_ttl)  # the monitors' claim; controllers get it in their spec
    paths = [str(_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _write_json(path: Path, value: dict) -> None:
    """Replace path atomically: a reader (or a crash) sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)


def _process(entry: dict) -> psutil.Process | None:
    """The recorded process if it still runs (same pid *and* start time, not a zombie)."""
    try:
        proc = psutil.Process(int(entry["pid"]))
        if abs(proc.create_time() - float(entry["started"])) > 1.0:
            return None
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


def _inside(path: str | None, root: Path) -> bool:
    return bool(path) and Path(path).is_relative_to(root)


def _job_processes(job_dir: Path, job_id: str) -> list[psutil.Process]:
    """Every running process of one job, recorded or not.

    Controllers and monitors run a spec file inside the job's directory;
    learners (and whatever they start) carry the controller's TF_JOB_ID and a
    TF_WORKDIR inside it. Both tests name a file of this LCM's state
    directory, so another stack's job of the same id is never touched.
    """
    me = os.getpid()
    out = []
    for proc in psutil.process_iter(["status", "cmdline"]):
        try:
            if proc.pid == me or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            argv = proc.info["cmdline"] or []
            if any(a == "--spec" and _inside(b, job_dir) for a, b in zip(argv, argv[1:], strict=False)):
                out.append(proc)
                continue
            env = proc.environ()
            if env.get("TF_JOB_ID") == job_id and _inside(env.get("TF_WORKDIR"), job_dir):
                out.append(proc)
        except (psutil.Error, OSError):
            continue
    return out


def _descendants(procs: Iterable[psutil.Process]) -> set[int]:
    out = set()
    for proc in procs:
        out.add(proc.pid)
        try:
            out.update(c.pid for c in proc.children(recursive=True))
        except psutil.Error:
            pass
    return out


def _final_status(doc: dict | None) -> bool:
    """Whether a learner status doc is one a controller writes last (it outlives the controller's lease)."""
    try:
        return doc is not None and LearnerState(int(doc.get("state", 0))) in _FINAL_LEARNER
    except (TypeError, ValueError):
        return False


def _group_members(pgid: int, under: Path) -> list[psutil.Process]:
    """Running processes of group `pgid` working inside `under`.

    The directory check keeps a recycled pid's unrelated process group safe
    when the recorded leader is gone: ours all run in the attempt directory.
    """
    out = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or os.getpgid(proc.pid) != pgid:
                continue
            if Path(proc.cwd()).is_relative_to(under):
                out.append(proc)
        except (psutil.Error, OSError):
            continue
    return out


class LocalBackend(Backend):
    name = "local"

    def __init__(self, settings: LcmSettings, coordinator: Coordinator | None = None, *,
                 kill_grace: float = KILL_GRACE, start_timeout: float = START_TIMEOUT,
                 supervise_interval: float = SUPERVISE_INTERVAL):
        self._settings = settings
        self._own_coordinator = coordinator is None
        self._coord = coordinator or Coordinator(settings.etcd_endpoints, settings.etcd_prefix)
        self._keys = self._coord.keys
        self._kill_grace = kill_grace
        self._start_timeout = start_timeout
        self._python = settings.python or sys.executable
        self._gpus = settings.local_gpus if settings.local_gpus >= 0 else detect_gpus()
        self._work = Path(settings.state_dir).resolve() / "work"
        self._records_dir = Path(settings.state_dir).resolve() / "lcm" / "jobs"
        self._lock = threading.Lock()
        self._job_locks: dict[str, threading.Lock] = {}
        self._records: dict[str, dict] = {}
        self._children: dict[int, subprocess.Popen] = {}
        self._respawned: dict[str, float] = {}
        self._closing = threading.Event()
        self._adopt()
        self._supervisor = threading.Thread(target=self._supervise, args=(supervise_interval,),
                                            name="lcm-supervisor", daemon=True)
        self._supervisor.start()

    # -- records ----------------------------------------------------------------

    def _record_path(self, job_id: str) -> Path:
        return self._records_dir / f"{job_id}.json"

    def _save(self, record: dict) -> None:
        _write_json(self._record_path(record["job_id"]), record)

    def _forget(self, job_id: str) -> None:
        self._records.pop(job_id, None)
        self._record_path(job_id).unlink(missing_ok=True)

    def _adopt(self) -> None:
        """Take over the records of a previous LCM; forget deployments whose processes are all gone."""
        if not self._records_dir.is_dir():
            return
        for path in sorted(self._records_dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
                job_id = record["job_id"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("ignoring unreadable deployment record %s: %s", path, e)
                continue
            if self._live(record):
                # (one marked `killing` too: the Trainer asks again until its KillJob succeeds)
                self._records[job_id] = record
                log.info("adopted job %s attempt %s: %s", job_id, record.get("attempt"),
                         ", ".join(self._handles(record)))
            elif self._unfinished(record):
                # everything died while no LCM watched (e.g. its monitor was killed and the learners
                # finished): the supervisor starts the monitor again, which reports from etcd
                self._records[job_id] = record
                log.info("adopted job %s attempt %s: nothing runs but its monitor never finished",
                         job_id, record.get("attempt"))
            else:
                path.unlink(missing_ok=True)
                log.info("forgot job %s attempt %s: none of its processes runs", job_id, record.get("attempt"))

    def _job_lock(self, job_id: str) -> threading.Lock:
        with self._lock:
            return self._job_locks.setdefault(job_id, threading.Lock())

    # -- liveness -----------------------------------------------------------------

    def _reap(self) -> None:
        """Collect exited children so they do not linger as zombies."""
        with self._lock:
            for pid, popen in list(self._children.items()):
                if popen.poll() is not None:
                    del self._children[pid]

    def _live_processes(self, record: dict) -> list[dict]:
        return [e for e in record.get("processes", []) if _process(e) is not None]

    def _live(self, record: dict) -> bool:
        return bool(self._live_processes(record))

    @staticmethod
    def _complete(record: dict) -> bool:
        """Whether every process of the attempt was started (an LCM killed mid-deploy may have left fewer)."""
        roles = {e["role"] for e in record.get("processes", [])}
        return roles >= {"monitor", *(f"controller-{r}" for r in range(int(record.get("learners", 0))))}

    @staticmethod
    def _monitor_done(record: dict) -> bool:
        return (Path(record["attempt_dir"]) / MONITOR_DONE).exists()

    def _unfinished(self, record: dict) -> bool:
        """A fully deployed attempt, not being removed, whose monitor has not delivered its last state."""
        return not record.get("killing") and self._complete(record) and not self._monitor_done(record)

    # -- supervision --------------------------------------------------------------

    def _supervise(self, interval: float) -> None:
        """Start again a job monitor that died before delivering its attempt's last state."""
        while not self._closing.wait(interval):
            try:
                self.supervise_once()
            except Exception:
                log.exception("supervision pass failed")

    def supervise_once(self) -> None:
        """One look at every deployment (the supervisor thread's pass)."""
        self._reap()
        with self._lock:
            job_ids = list(self._records)
        for job_id in job_ids:
            self._revive_monitor(job_id)
            self._report_dead_controllers(job_id)

    def _revive_monitor(self, job_id: str) -> None:
        lock = self._job_lock(job_id)
        if not lock.acquire(blocking=False):
            return  # a deploy or kill of this job is under way
        try:
            record = self._records.get(job_id)
            if record is not None:
                self._revive_monitor_locked(record, spaced=True)
        finally:
            lock.release()

    def _revive_monitor_locked(self, record: dict, *, spaced: bool) -> None:
        """Start the monitor of an unfinished attempt again if it is gone (the caller holds the job's lock).

        spaced: leave at least RESPAWN_SPACING between two starts (a monitor that keeps dying at
        start, e.g. while etcd is down, is not started in a tight loop).
        """
        job_id = record["job_id"]
        if not self._unfinished(record):
            return
        if any(_process(e) is not None for e in record["processes"] if e["role"] == "monitor"):
            return
        if spaced and time.monotonic() - self._respawned.get(job_id, -1e9) < RESPAWN_SPACING:
            return
        self._respawned[job_id] = time.monotonic()
        log.warning("job %s attempt %s: its monitor died before the attempt ended; starting it again",
                    job_id, record["attempt"])
        attempt_dir = Path(record["attempt_dir"])
        record["processes"] = [e for e in record["processes"] if e["role"] != "monitor"]
        self._spawn(record, "monitor", "services.jobmonitor", attempt_dir / "monitor.json",
                    attempt_dir / "monitor.log", child_env(self._settings))

    def _report_dead_controllers(self, job_id: str) -> None:
        """Say for a dead controller that its learner failed, where etcd holds no status of that rank.

        A controller killed before its learner had any status leaves nothing for the monitor to see
        go away; one killed later leaves a leased status that expires, and a monitor started after
        that (its own predecessor was killed too) never saw it: both would wait out the monitor's
        start timeout. Written create-if-absent, so a final status the controller wrote always wins;
        a leased one is left to expire first.
        """
        lock = self._job_lock(job_id)
        if not lock.acquire(blocking=False):
            return
        try:
            record = self._records.get(job_id)
            if record is None or not self._unfinished(record):
                return
            reported = set(record.get("reported_dead", []))
            for entry in record["processes"]:
                role = entry["role"]
                if not role.startswith("controller-") or role in reported or _process(entry) is not None:
                    continue
                rank = int(role.split("-", 1)[1])
                doc = {"state": int(LearnerState.LEARNER_FAILED), "attempt": record["attempt"], "exit_code": None,
                       "ts": time.time(), "tail": [], "outputs_uri": "",
                       "message": f"its controller (pid {entry['pid']}) ended without reporting the learner"}
                key = self._keys.learner_status(job_id, rank)
                try:
                    if self._coord.create(key, doc):
                        log.warning("job %s attempt %s: controller %d died before reporting; learner failed",
                                    job_id, record["attempt"], rank)
                    elif not _final_status(self._coord.get(key)[0]):
                        continue  # its leased status has yet to expire; look again next pass
                except TrainforgeError as e:
                    log.debug("could not report controller %d of job %s: %s", rank, job_id, e.message)
                    continue
                reported.add(role)
            if reported != set(record.get("reported_dead", [])):
                record["reported_dead"] = sorted(reported)
                with self._lock:
                    self._save(record)
        finally:
            lock.release()

    @staticmethod
    def _handles(record: dict) -> list[str]:
        return [f"{e['role']}:{e['pid']}" for e in record.get("processes", [])]

    # -- Backend ------------------------------------------------------------------

    def deploy(self, job: JobDeployment) -> list[str]:
        self._reap()
        with self._job_lock(job.job_id):
            existing = self._records.get(job.job_id)
            if existing is not None:
                if job.attempt < existing["attempt"]:
                    raise Conflict(f"job {job.job_id}: attempt {job.attempt} is older than the deployed "
                                   f"attempt {existing['attempt']}")
                if job.attempt == existing["attempt"] and not existing.get("killing") and self._complete(existing) \
                        and (self._live(existing) or not self._monitor_done(existing)):
                    # deployed already (a resent request): never a second run of the same attempt; a
                    # dead monitor is started again and reports what became of it
                    log.info("job %s attempt %d already deployed", job.job_id, job.attempt)
                    self._revive_monitor_locked(existing, spaced=False)
                    return self._handles(existing)
                log.info("job %s: replacing attempt %d with attempt %d", job.job_id, existing["attempt"],
                         job.attempt)
                self._mark_killing(existing)
                self._stop(job.job_id, existing)
                self._coord.delete_prefix(self._keys.job(job.job_id))
                with self._lock:
                    self._forget(job.job_id)
            record = self._reserve(job)
            try:
                self._start(job, record)
            except BaseException:
                self._stop(job.job_id, record)
                with self._lock:
                    self._forget(job.job_id)
                raise
            log.info("job %s attempt %d deployed: %s", job.job_id, job.attempt, ", ".join(self._handles(record)))
            return self._handles(record)

    def _reserve(self, job: JobDeployment) -> dict:
        """Check the machine has room, pick GPUs and a port, and record the deployment before it starts."""
        per_learner = job.manifest.resources.gpus
        with self._lock:
            # a record without processes yet is a deployment in flight on another thread: it holds its share
            others = [r for j, r in self._records.items()
                      if j != job.job_id and (not r.get("processes") or self._live(r))]
            running = sum(int(r.get("learners", 0)) for r in others)
            limit = self._settings.local_max_learners
            if running + job.learners > limit:
                raise ResourceExhausted(f"needs {job.learners} learner(s); the local backend runs at most "
                                        f"{limit} and {running} are running")
            used = {g for r in others for g in r.get("gpu_ids", [])}
            free = [g for g in range(self._gpus) if g not in used]
            need = per_learner * job.learners
            if need > len(free):
                raise ResourceExhausted(f"needs {need} GPU(s); the local backend has {len(free)} of "
                                        f"{self._gpus} free")
            attempt_dir = self._work / job.job_id / str(job.attempt)
            record = {
                "job_id": job.job_id, "team": job.team, "attempt": job.attempt, "learners": job.learners,
                "gpu_ids": free[:need], "master_port": free_port(), "attempt_dir": str(attempt_dir),
                "created_at": time.time(), "processes": [],
            }
            self._records[job.job_id] = record
            self._save(record)
            return record

    def _start(self, job: JobDeployment, record: dict) -> None:
        attempt_dir = Path(record["attempt_dir"])
        attempt_dir.mkdir(parents=True, exist_ok=True)
        # a deploy of this attempt that is redone must not inherit the marker of the one before
        (attempt_dir / MONITOR_DONE).unlink(missing_ok=True)
        monitor_spec = attempt_dir / "monitor.json"
        _write_json(monitor_spec, {"job_id": job.job_id, "team": job.team, "attempt": job.attempt,
                                   "learners": job.learners, "start_timeout": self._start_timeout})
        per_learner = job.manifest.resources.gpus
        learner_specs = []
        for rank in range(job.learners):
            workdir = attempt_dir / f"learner-{rank}"
            workdir.mkdir(exist_ok=True)
            spec = attempt_dir / f"learner-{rank}.json"
            _write_json(spec, {
                "job_id": job.job_id, "team": job.team, "attempt": job.attempt, "rank": rank,
                "world_size": job.learners, "manifest": job.manifest.model_dump(mode="json"),
                "code_uri": job.code_uri, "checkpoint_uri": job.checkpoint_uri, "workdir": str(workdir),
                "master_addr": "127.0.0.1", "master_port": record["master_port"],
                "gpu_ids": record["gpu_ids"][rank * per_learner:(rank + 1) * per_learner],
                "lease_ttl": self._settings.lease_ttl,
            })
            learner_specs.append(spec)
        self._coord.put(self._keys.attempt(job.job_id), {"attempt": job.attempt, "learners": job.learners,
                                                         "checkpoint_uri": job.checkpoint_uri})
        env = child_env(self._settings)
        self._spawn(record, "monitor", "services.jobmonitor", monitor_spec, attempt_dir / "monitor.log", env)
        for rank, spec in enumerate(learner_specs):
            self._spawn(record, f"controller-{rank}", "services.controller", spec,
                        attempt_dir / f"controller-{rank}.log", env)

    def _spawn(self, record: dict, role: str, module: str, spec: Path, log_path: Path,
               env: dict[str, str]) -> None:
        argv = [self._python, "-m", module, "--spec", str(spec)]
        try:
            with open(log_path, "ab") as out:
                popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=record["attempt_dir"], env=env, start_new_session=True)
        except OSError as e:
            raise TrainforgeError(f"cannot start the {role} of job {record['job_id']} with {self._python}: {e}")\
                from None
        try:
            started = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            started = time.time()  # already gone; the record still names it for the logs
        with self._lock:
            self._children[popen.pid] = popen
            record["processes"].append({"role": role, "pid": popen.pid, "started": started})
            self._save(record)

    def kill(self, job_id: str) -> int:
        check_job_id(job_id)
        self._reap()
        with self._job_lock(job_id):
            record = self._records.get(job_id)
            if record is not None:
                self._mark_killing(record)
            killed = self._stop(job_id, record)
            self._coord.delete_prefix(self._keys.job(job_id))
            with self._lock:
                self._forget(job_id)
        log.info("job %s killed: %d process(es) were running", job_id, killed)
        return killed

    def _mark_killing(self, record: dict) -> None:
        if not record.get("killing"):
            record["killing"] = True
            with self._lock:
                self._save(record)

    def _stop(self, job_id: str, record: dict | None) -> int:
        """SIGTERM the monitor, then the controllers (each its process group) and every other process of
        the job (orphaned learners, any attempt); SIGKILL what outlives the grace. Returns how many of
        the recorded processes and orphans were running.

        The monitor goes first so it does not report the learners it sees dying.
        """
        entries = record.get("processes", []) if record else []
        alive = self._live_processes(record) if record else []
        monitors = [e for e in entries if e["role"] == "monitor"]
        controllers = [e for e in entries if e["role"] != "monitor"]
        under = Path(record["attempt_dir"]) if record else self._work / job_id
        self._terminate(monitors, under)
        ours = _descendants(p for e in controllers if (p := _process(e)) is not None)
        orphans = [p for p in _job_processes(self._work / job_id, job_id) if p.pid not in ours]
        if orphans:
            log.info("job %s: stopping %d process(es) no live controller watches: %s", job_id, len(orphans),
                     ", ".join(str(p.pid) for p in orphans))
        self._terminate(controllers, under, orphans)
        recorded = {int(e["pid"]) for e in alive}
        return len(alive) + sum(p.pid not in recorded for p in orphans)

    def _terminate(self, entries: list[dict], under: Path, extra: Iterable[psutil.Process] = ()) -> None:
        targets: dict[int, psutil.Process] = {}
        for proc in extra:
            targets[proc.pid] = proc
            try:
                targets.update({c.pid: c for c in proc.children(recursive=True)})
            except psutil.Error:
                pass
        groups: list[int] = []
        for entry in entries:
            leader = _process(entry)
            pid = int(entry["pid"])
            members = ([leader] if leader else []) + _group_members(pid, under)
            if not members:
                continue  # gone, or the pid now belongs to someone else
            groups.append(pid)
            for proc in members:
                targets[proc.pid] = proc
                try:
                    targets.update({c.pid: c for c in proc.children(recursive=True)})
                except psutil.Error:
                    pass
        if not targets:
            return
        self._signal(groups, targets.values(), signal.SIGTERM)
        if self._wait_gone(targets.values(), self._kill_grace):
            return
        left = [p for p in targets.values() if self._running(p)]
        log.warning("SIGKILL for %d process(es) that outlived %gs: %s", len(left), self._kill_grace,
                    ", ".join(str(p.pid) for p in left))
        self._signal(groups, left, signal.SIGKILL)
        if not self._wait_gone(left, 5.0):
            log.error("processes survived SIGKILL: %s", ", ".join(str(p.pid) for p in left if self._running(p)))

    @staticmethod
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

    def _running(self, proc: psutil.Process) -> bool:
        popen = self._children.get(proc.pid)
        if popen is not None:
            return popen.poll() is None  # for our own children this also reaps them
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _wait_gone(self, procs: Iterable[psutil.Process], timeout: float) -> bool:
        procs = list(procs)
        deadline = time.monotonic() + timeout
        while True:
            self._reap()
            if not any(self._running(p) for p in procs):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)

    def capacity(self) -> Capacity:
        s = self._settings
        return Capacity(backend=self.name, gpus=self._gpus, cpus=float(s.local_cpus or os.cpu_count() or 1),
                        memory=int(s.local_memory or psutil.virtual_memory().total),
                        max_learners=s.local_max_learners)

    def running_jobs(self) -> list[RunningJob]:
        self._reap()
        with self._lock:
            records = list(self._records.values())
        return [RunningJob(r["job_id"], r["attempt"], r["learners"], self._handles(r))
                for r in records if self._live(r)]

    def close(self) -> None:
        self._closing.set()
        self._supervisor.join(10)
        self._reap()
        if self._own_coordinator:
            self._coord.close()

"""Helpers for the crash tests: an embedded stack to SIGKILL pieces of, a process-table watcher, checks.

`ChaosStack` runs the stack as `trainforge up` does (every component its own
process, on loopback ports recorded in `stack.json`) with the settings the
crash tests need (short leases, short kill grace), SIGKILLs one component
and starts it again the way `trainforge up` does (only what is not running,
on the same ports, same data directories).

`ProcessWatch` samples the process table in a thread and records, per job,
which attempts had a controller or a learner alive at the same instant; a
job must never have two (docs/CONTRACTS.md: a new attempt's deploy removes
the last one first).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.servers import wait_for
from trainforge.sdk import ApiError, Client
from trainforge_services.common import proctree
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.states import JobState, can_transition
from trainforge_services.devstack import etcdusers, launcher, procs

TERMINAL = ("completed", "failed", "cancelled")
# The API answers these while it, the Trainer or the LCM is being restarted.
TRANSIENT = (0, 502, 503, 504)


@contextlib.contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    """os.environ with `values` (None: unset) for the duration; launcher.up hands it to every component."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class ChaosStack:
    """The embedded stack under `state`, with `settings` (TF_*) in every component's environment."""

    def __init__(self, state: Path, settings: dict[str, str], replicas: int | None = None):
        self.state = state
        self.replicas = replicas  # API, Trainer and LCM processes each (`trainforge up --replicas`)
        # nothing of the test's own TF_* environment leaks into the stack
        self._settings: dict[str, str | None] = {**dict.fromkeys(k for k in os.environ if k.startswith("TF_")),
                                                  **settings}
        self.kills: list[tuple[float, str, str]] = []  # (time, what, detail)
        self.client: Client | None = None
        self._clients: list[Client] = []

    def up(self) -> None:
        with _environment(self._settings):
            launcher.up(self.state, timeout=150, replicas=self.replicas)
        if self.client is None:
            self.client = self.new_client()

    @classmethod
    @contextlib.contextmanager
    def running(cls, state: Path, settings: dict[str, str], replicas: int | None = None) -> Iterator[ChaosStack]:
        """A stack started under `state`, stopped (whatever happened) when the block ends."""
        c = cls(state, settings, replicas)
        try:
            c.up()
            yield c
        finally:
            c.down()

    def new_client(self) -> Client:
        """A client of its own (for another thread), with the key `trainforge up` created."""
        cfg = json.loads((self.state / "config.json").read_text())
        return Client(cfg["api_url"], cfg["api_key"])

    def down(self) -> None:
        for client in [self.client, *self._clients]:
            if client is not None:
                client.close()
        launcher.down(self.state, grace=10)

    @property
    def meta(self) -> dict:
        return procs.read_meta(self.state)

    @property
    def stack_id(self) -> str:
        return self.meta["stack_id"]

    def coordinator(self) -> Coordinator:
        user, password = etcdusers.login(self.state, "/trainforge", "lcm")  # the LCM's: every key
        return Coordinator(f"127.0.0.1:{self.meta['ports']['etcd']}", "/trainforge", user=user, password=password)

    def log(self, name: str) -> str:
        return (self.state / "logs" / f"{name}.log").read_text(errors="replace")

    # -- killing --------------------------------------------------------------------

    def sigkill(self, name: str) -> None:
        """SIGKILL a component `trainforge up` started (and wait until it is gone)."""
        pid = int((self.state / "pids" / f"{name}.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: _exited(pid), 10, f"{name} to die")
        self.kills.append((time.monotonic(), name, f"pid {pid}"))

    def kill_component(self, name: str) -> None:
        """SIGKILL a component and start it again as `trainforge up` does."""
        self.sigkill(name)
        self.up()

    def kill_one(self, module: str, rng: random.Random, choose: Callable[[dict], bool] = lambda spec: True
                 ) -> dict | None:
        """SIGKILL one running `services.<module>` process of this stack whose spec `choose` accepts.

        Returns {job_id, attempt, role, pid} of the victim, or None when there was none.
        """
        candidates = []
        for proc in procs.stack_processes(self.stack_id):
            spec = _spec_of(proc, module)
            if spec is not None and choose(spec):
                candidates.append((proc, spec))
        if not candidates:
            return None
        proc, spec = rng.choice(candidates)
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return None
        victim = {**spec, "pid": proc.pid}
        self.kills.append((time.monotonic(), module, f"{spec['job_id']} attempt {spec['attempt']}"))
        return victim

    # -- the API, riding out restarts ------------------------------------------------

    def call(self, fn: Callable, *args, timeout: float = 90, **kwargs):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return fn(*args, **kwargs)
            except ApiError as e:
                if e.status not in TRANSIENT or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def jobs(self, client: Client | None = None) -> dict[str, dict]:
        return {j["id"]: j for j in self.call((client or self.client).list, None, 1000)}

    def jobs_of_own_client(self) -> Callable[[], dict[str, dict]]:
        """`jobs` through a client of its own, for another thread."""
        client = self.new_client()
        self._clients.append(client)
        return lambda: self.jobs(client)


def _exited(pid: int) -> bool:
    proctree.reap(pid)  # our child when this test started the stack
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _spec_of(proc: psutil.Process, module: str) -> dict | None:
    """{job_id, attempt, role} of a controller or monitor, from the spec path in its argv."""
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return None
    if f"trainforge_services.{module}" not in argv or "--spec" not in argv[:-1]:
        return None
    path = Path(argv[argv.index("--spec") + 1])
    return {"job_id": path.parent.parent.name, "attempt": int(path.parent.name), "role": path.stem,
            "attempt_dir": str(path.parent)}


# -- watching the process table ---------------------------------------------------------


@dataclass
class ProcessWatch:
    """Samples the processes of a stack in a thread; what it saw that must never be is kept in lists.

    overlaps: a job had controllers or learners of two attempts alive at one instant.
    duplicates: two controllers, or two learners (trees of processes with the learner's environment),
      of one (job, attempt, rank) at one instant.
    late: a learner or controller still alive `grace` seconds after its job ended (the Trainer's
      KillJob follows the end within seconds; a learner orphaned by a killed controller must not
      run on). Needs `jobs`, polled every second, to know when each job ended.
    """

    stack_id: str
    jobs: Callable[[], dict[str, dict]] | None = None
    grace: float = 15.0
    interval: float = 0.3
    samples: int = 0
    seen: dict[str, set[int]] = field(default_factory=dict)  # job -> attempts ever seen running
    ended: dict[str, float] = field(default_factory=dict)  # job -> when it was first seen terminal
    overlaps: list[tuple[str, list[int], list[str]]] = field(default_factory=list)
    duplicates: list[tuple[str, int, str, list[int]]] = field(default_factory=list)
    late: list[tuple[str, float, list[str]]] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name="process-watch", daemon=True)]
        if self.jobs is not None:
            self._threads.append(threading.Thread(target=self._follow_jobs, name="job-watch", daemon=True))

    def __enter__(self) -> ProcessWatch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def _follow_jobs(self) -> None:
        while not self._stop.wait(1.0):
            try:
                jobs = self.jobs()
            except Exception:  # noqa: BLE001 - the API may be down for a moment: look again
                continue
            now = time.monotonic()
            for job_id, job in jobs.items():
                if job["state"] in TERMINAL:
                    self.ended.setdefault(job_id, now)

    def sample(self) -> None:
        alive: dict[str, dict[int, list[str]]] = {}  # job -> attempt -> "role:pid"
        units: dict[tuple[str, int, str], set[int]] = {}  # (job, attempt, role) -> controller pids / learner roots
        learners: dict[int, tuple[tuple[str, int, str], int]] = {}  # pid -> (key, parent pid)
        # Processes whose environment cannot be read (zombies, and a process that is exiting: its memory,
        # environment included, is released before it is gone) with their parents. A sandboxed learner's
        # namespace init is one of these while the kernel tears the namespace down, and the learner's tree
        # must not look like two trees then: the walk below passes through them.
        opaque: dict[int, int] = {}
        controllers: dict[int, tuple[tuple[str, int, str], int]] = {}  # pid -> (key, parent pid)
        for proc in psutil.process_iter(["status", "ppid"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE:
                    opaque[proc.pid] = proc.info["ppid"]
                    continue
                env = proc.environ()
                if not env:
                    opaque[proc.pid] = proc.info["ppid"]
                    continue
                if env.get("TF_STACK_ID") != self.stack_id:
                    continue
                if "TF_JOB_ID" in env:  # a learner, or what it started
                    job, attempt, role = env["TF_JOB_ID"], int(env["TF_ATTEMPT"]), f"learner-{env['TF_RANK']}"
                    learners[proc.pid] = ((job, attempt, role), proc.info["ppid"])
                else:
                    spec = _spec_of(proc, "controller")
                    if spec is None:
                        continue
                    job, attempt, role = spec["job_id"], spec["attempt"], f"controller-{spec['role']}"
                    controllers[proc.pid] = ((job, attempt, role), proc.info["ppid"])
            except (psutil.Error, OSError, KeyError, ValueError):
                continue
            alive.setdefault(job, {}).setdefault(attempt, []).append(f"{role}:{proc.pid}")
        # A controller's own child between its fork and its exec (the learner's guard or sandbox entry, about
        # to start) still shows the controller's command line and environment: a copy of a controller is
        # one whose parent is not a controller of the same unit.
        for pid, (key, parent) in controllers.items():
            if not (parent in controllers and controllers[parent][0] == key):
                units.setdefault(key, set()).add(pid)
        # one copy of a learner is one tree of processes with its environment: count the trees' roots
        for pid, (key, parent) in learners.items():
            root, through = pid, 0
            while through <= 3:
                if parent in learners and learners[parent][0] == key:
                    root, parent, through = parent, learners[parent][1], 0
                elif parent in opaque:
                    parent, through = opaque[parent], through + 1
                else:
                    break
            units.setdefault(key, set()).add(root)
        self.samples += 1
        now = time.monotonic()
        for job, attempts in alive.items():
            self.seen.setdefault(job, set()).update(attempts)
            running = [p for ps in attempts.values() for p in ps]
            if len(attempts) > 1:
                self.overlaps.append((job, sorted(attempts), running))
            if job in self.ended and now - self.ended[job] > self.grace:
                self.late.append((job, round(now - self.ended[job], 1), running))
        for (job, attempt, role), found in units.items():
            if len(found) > 1:
                self.duplicates.append((job, attempt, role, sorted(found)))


def diagnose(state: Path, job_ids: Iterable[str], lines: int = 15) -> str:
    """What the stack's logs say of jobs that did not end: each attempt's monitor log tail, and the
    service log lines naming the job (a CI failure then tells why, not only that)."""
    out = []
    service_logs = sorted((state / "logs").glob("*.log"))
    for job_id in job_ids:
        out.append(f"== job {job_id}")
        for log_path in sorted(state.rglob(f"work/{job_id}/*/*.log")):
            tail = log_path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"-- {log_path.relative_to(state)} (last {len(tail)} lines)")
            out.extend(tail)
        for log_path in service_logs:
            named = [ln for ln in log_path.read_text(errors="replace").splitlines() if job_id in ln][-lines:]
            if named:
                out.append(f"-- {log_path.name}, lines naming the job")
                out.extend(named)
    return "\n".join(out)


# -- checks ---------------------------------------------------------------------------


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans [start, end) that overlap at one instant."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def check_history(job: dict) -> None:
    """One legal chain of transitions, entering a terminal state exactly once, one DEPLOYING per attempt."""
    history = job["history"]
    ends = [h for h in history if h["to"] in TERMINAL]
    assert len(ends) == 1, f"{job['id']} entered a terminal state {len(ends)} times: {history}"
    assert history[-1]["to"] == job["state"], f"{job['id']}: the history does not end in the job's state"
    assert job["reason"].strip(), f"{job['id']} ended {job['state']} without a reason"
    for before, after in zip(history, history[1:], strict=False):
        assert after["from"] == before["to"], f"{job['id']}: broken chain {before} -> {after}"
        assert can_transition(JobState[after["from"].upper()], JobState[after["to"].upper()]), \
            f"{job['id']}: illegal transition {after}"
        assert after["timestamp"] >= before["timestamp"], f"{job['id']}: history out of order"
    deploys = sum(h["to"] == "deploying" for h in history)
    assert deploys == job["attempt"], f"{job['id']}: {deploys} deployments for attempt {job['attempt']}"


def job_processes(stack_id: str, ids: set[str]) -> list[str]:
    """Controllers, monitors and learners of the given jobs still running."""
    out = []
    for proc in procs.stack_processes(stack_id):
        try:
            env = proc.environ()
            spec = _spec_of(proc, "controller") or _spec_of(proc, "jobmonitor")
            if env.get("TF_JOB_ID") in ids or (spec and spec["job_id"] in ids):
                out.append(f"{proc.pid}: {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            continue
    return out


def assert_everything_agrees(chaos: ChaosStack, ids: set[str]) -> None:
    """MongoDB (the ended jobs), etcd, the LCM's records and the process table tell one story."""
    coord = chaos.coordinator()
    try:
        def leftovers() -> dict:
            keys = coord.list("/trainforge/jobs/")[0]
            return {k: v for k, v in keys.items() if k.split("/")[3] in ids}

        try:
            wait_for(lambda: not leftovers(), 60, "etcd to hold no keys of ended jobs", interval=0.5)
        except TimeoutError:
            raise AssertionError(f"etcd keys of ended jobs: {leftovers()}") from None
    finally:
        coord.close()
    records = chaos.state / "lcm" / "jobs"
    wait_for(lambda: not [p for p in records.glob("*.json") if p.stem in ids], 30,
             "the LCM to hold no deployment record of an ended job", interval=0.5)
    try:
        wait_for(lambda: not job_processes(chaos.stack_id, ids), 30,
                 "no controller, monitor or learner of an ended job to be left", interval=0.5)
    except TimeoutError:
        raise AssertionError(f"processes left: {job_processes(chaos.stack_id, ids)}") from None

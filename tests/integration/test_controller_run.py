"""The controller as a real process against real etcd, the log search server and a local object store."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.servers import wait_for
from trainforge_services.common import isolation, niceness
from trainforge_services.common.adapters.objectstore import store_from_settings
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.settings import ControllerSettings
from trainforge_services.common.states import LearnerState
from trainforge_services.controller.controller import Controller

PYTHON = sys.executable


def controller_env(settings, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    env.update({f"TF_{k.upper()}": str(v) for k, v in settings.model_dump().items()})
    env.update({"TF_LOG_BATCH_SECONDS": "0.1", "TF_KILL_GRACE": "2"})
    env.update({f"TF_{k.upper()}": str(v) for k, v in extra.items()})
    return env


def pack(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class Run:
    proc: subprocess.Popen
    job: str
    rank: int
    attempt: int
    spec_path: Path

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture
def launch(store_settings, tmp_path, unique):
    """Start a controller for a manifest; returns a Run. Everything started is stopped afterwards."""
    started: list[Run] = []

    def start(manifest: dict, *, rank: int = 0, world_size: int = 1, code: bytes | None = None, code_uri: str = "",
              job: str | None = None, master_port: int = 29500, attempt: int = 1, checkpoint_uri: str = "",
              gated: bool = False, reads: tuple[str, ...] = (), **env_extra) -> Run:
        job = job or f"job-{unique}"
        attempt_dir = tmp_path / "work" / job / str(attempt)
        attempt_dir.mkdir(parents=True, exist_ok=True)
        if code is not None:
            store_from_settings(store_settings).put_bytes(f"jobs/{job}/code.tar.gz", code)
            code_uri = f"store://jobs/{job}/code.tar.gz"
        spec = {"job_id": job, "team": "team-a", "attempt": attempt, "rank": rank, "world_size": world_size,
                "manifest": {"name": "t"} | manifest, "code_uri": code_uri, "checkpoint_uri": checkpoint_uri,
                "workdir": str(attempt_dir / f"learner-{rank}"), "master_addr": "127.0.0.1",
                "master_port": master_port, "gpu_ids": [], "lease_ttl": 4, "reads": list(reads)} | (
                    {"gated": True} if gated else {})
        spec_path = attempt_dir / f"learner-{rank}.json"
        spec_path.write_text(json.dumps(spec))
        with open(attempt_dir / f"controller-{rank}.log", "w") as log_file:
            proc = subprocess.Popen([PYTHON, "-m", "trainforge_services.controller", "--spec", str(spec_path)],
                                    env=controller_env(store_settings, **env_extra), cwd=Path(__file__).parents[2],
                                    stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True)
        run = Run(proc, job, rank, attempt, spec_path)
        started.append(run)
        return run

    yield start
    for run in started:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()
    for job in {run.job for run in started}:
        isolation.remove_job(job)  # the sandbox's netns and cgroups: the LCM's stop does this for its jobs


def status(coordinator, run: Run) -> dict | None:
    return coordinator.get(coordinator.keys.learner_status(run.job, run.rank))[0]


def controller_log(run: Run) -> str:
    return (run.spec_path.parent / f"controller-{run.rank}.log").read_text()


def watch_states(coordinator, run_job: str) -> tuple[list[int], threading.Event]:
    """Every learner state written under the job's status keys, in order, collected from an etcd watch."""
    seen: list[int] = []
    stop = threading.Event()
    ready = threading.Event()

    def watch():
        for ev in coordinator.watch_prefix(coordinator.keys.learners(run_job), stop=stop):
            if ev.kind == "resync":
                ready.set()
            elif ev.kind == "put" and ev.key.endswith("/status"):  # not the halted/checkpoint keys
                seen.append(ev.value["state"])

    threading.Thread(target=watch, daemon=True).start()
    assert ready.wait(10), "the watch did not start"
    return seen, stop


def test_a_learner_that_succeeds(launch, coordinator, logstore, store_settings, unique):
    seen, stop_watch = watch_states(coordinator, f"job-{unique}")
    run = launch({"command": "echo one; echo two; echo three; mkdir -p results && echo 42 > results/answer.txt",
                  "outputs": "results/"})
    assert run.wait() == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, doc
    assert doc["exit_code"] == 0 and doc["attempt"] == 1 and doc["message"] == ""
    assert doc["outputs_uri"] == f"store://jobs/{run.job}/outputs/0/"
    assert doc["tail"] == ["one", "two", "three"]
    # Read after the controller exited and revoked its lease: the final status is held by no lease.

    logstore.refresh()
    lines = logstore.read(run.job).lines
    assert [(ln["seq"], ln["line"], ln["stream"]) for ln in lines] == [
        (1, "one", "stdout"), (2, "two", "stdout"), (3, "three", "stdout")]
    assert {(ln["team"], ln["learner"], ln["attempt"]) for ln in lines} == {("team-a", 0, 1)}

    store = store_from_settings(store_settings)
    assert store.get_bytes(f"jobs/{run.job}/outputs/0/answer.txt") == b"42\n"
    archive = [json.loads(raw) for raw in store.get_bytes(f"jobs/{run.job}/logs/0-1.jsonl").splitlines()]
    assert [d["line"] for d in archive] == ["one", "two", "three"]

    wait_for(lambda: seen and seen[-1] == LearnerState.LEARNER_COMPLETED, 10, "the COMPLETED event")
    stop_watch.set()
    assert seen == sorted(seen), f"states went backwards: {seen}"
    assert LearnerState.LEARNER_STORING in seen


def test_a_learner_that_fails(launch, coordinator, logstore):
    run = launch({"command": "echo starting; echo boom >&2; exit 3"})
    assert run.wait() == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["exit_code"] == 3
    assert doc["message"] == "learner exited with code 3"
    assert "boom" in doc["tail"]
    logstore.refresh()
    lines = logstore.read(run.job).lines
    assert [ln["seq"] for ln in lines] == [1, 2, 3]
    assert {ln["line"]: ln["stream"] for ln in lines} == {
        "starting": "stdout", "boom": "stderr", "learner exited with code 3": "system"}


def command_processes(run: Run, name: str) -> list[psutil.Process]:
    """The controller's descendants running the program `name` (by its own name: the guard's or the sandbox
    entry's argv holds the whole command, so it names the program long before the shell started it)."""
    found = []
    for p in psutil.Process(run.proc.pid).children(recursive=True):
        try:
            if p.name() == name:
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_sigterm_to_the_controller_stops_the_learner(launch, coordinator):
    run = launch({"command": "echo ready; sleep 1000"})
    wait_for(lambda: (status(coordinator, run) or {}).get("state") == LearnerState.LEARNER_RUNNING, 30,
             "the learner to run")
    # the shell started sleep, so it printed "ready" before: a stop now must reach the user's command
    learner_procs = wait_for(lambda: command_processes(run, "sleep"), 30, "the sleep process")
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(30) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["exit_code"] == 128 + signal.SIGTERM
    assert "the controller received SIGTERM" in doc["message"]
    assert "ready" in doc["tail"]
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in learner_procs)


def test_sigterm_to_the_controller_while_the_learner_starts_is_not_lost(launch, coordinator):
    # The smallest CPU quota (1 ms per 100 ms, a root sandbox's cgroup) stretches the learner's start (the
    # sandbox's entry, its pid 1, the shell) to seconds, so the stop reaches its group before the command
    # exists. The entry and pid 1 caught and dropped it, the command started anyway and was SIGKILLed when
    # the grace period ran out (exit 137, 7 of 10 runs before the fix); now the command either never starts
    # or gets the SIGTERM.
    run = launch({"command": "echo ready; sleep 1000", "resources": {"cpus": 0.01}})
    wait_for(lambda: (status(coordinator, run) or {}).get("state") == LearnerState.LEARNER_RUNNING, 30,
             "the learner to run")
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(30) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["exit_code"] == 128 + signal.SIGTERM, doc
    assert doc["message"] == ("the controller received SIGTERM; learner was killed by SIGTERM (exit code 143)")
    assert doc["tail"] in ([], ["ready"]), doc  # stopped before the command started, or after the echo


def test_a_learner_ignoring_sigterm_is_killed_after_the_grace_period(launch, coordinator):
    run = launch({"command": "trap '' TERM; sleep 1000"}, kill_grace=1)
    wait_for(lambda: (status(coordinator, run) or {}).get("state") == LearnerState.LEARNER_RUNNING, 30,
             "the learner to run")
    # sleep runs, so the trap is set: a SIGTERM before it would stop the learner before its command started
    wait_for(lambda: command_processes(run, "sleep"), 30, "the sleep process")
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(30) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["exit_code"] == 128 + signal.SIGKILL


@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_memory_limit(launch, coordinator, isolation):
    hog = f"{PYTHON} -c \"import time; b = b'x' * (300 * 2**20); time.sleep(100)\""
    run = launch({"command": hog, "resources": {"memory": "100Mi"}}, isolation=isolation)
    assert run.wait(60) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["exit_code"] == 128 + signal.SIGKILL
    if doc["isolation"] == "sandbox":  # the memory cgroup's OOM killer, not the watchdog
        assert doc["message"] == "memory limit exceeded: out of memory (OOM kill) in the learner's cgroup, limit 100.0Mi"
    else:
        assert doc["isolation"] == "none"
        assert doc["message"].startswith("memory limit exceeded: ") and doc["message"].endswith(" > 100.0Mi")


def test_code_data_and_env_reach_the_learner(launch, coordinator, store_settings):
    store = store_from_settings(store_settings)
    store.put_bytes("datasets/d/x.txt", b"from the store\n")
    code = pack({"run.py": "import os, pathlib\n"
                           "print(pathlib.Path('data/x.txt').read_text().strip())\n"
                           "print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MY_FLAG'])\n"
                           "print(sorted(k for k in os.environ if k.startswith('TF_S3') or k == 'TF_ETCD_ENDPOINTS'))\n"
                           "out = pathlib.Path(os.environ['TF_OUTPUT_DIR'])\n"
                           "(out / 'sub').mkdir(parents=True)\n"
                           "(out / 'sub' / 'r.txt').write_text('ok')\n"})
    run = launch({"command": "python run.py", "env": {"MY_FLAG": "on"}, "outputs": "out/",
                  "data": [{"source": "store://datasets/d", "path": "data"}]}, code=code, reads=("datasets/d",))
    assert run.wait() == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, doc
    assert doc["tail"] == ["from the store", "0 1 on", "[]"]
    assert store.get_bytes(f"jobs/{run.job}/outputs/0/sub/r.txt") == b"ok"


def test_a_missing_code_archive_fails_the_learner_with_a_reason(launch, coordinator):
    run = launch({"command": "true"}, job="nowhere", code_uri="store://jobs/nowhere/code.tar.gz")
    assert run.wait() == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["exit_code"] is None
    assert doc["message"] == "preparing the learner failed: code archive store://jobs/nowhere/code.tar.gz does not exist"


def test_an_unsafe_code_archive_is_refused(launch, coordinator, tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    run = launch({"command": "true"}, code=buf.getvalue())
    assert run.wait() == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["exit_code"] is None
    assert "'../escape.txt' has an absolute path or '..'" in doc["message"]
    assert not (tmp_path / "work" / run.job / "escape.txt").exists()


@pytest.mark.slow
def test_an_etcd_restart_does_not_disturb_the_learner(launch, coordinator, etcd_server):
    run = launch({"command": "echo waiting; while [ ! -f go ]; do sleep 0.05; done; echo done"})
    wait_for(lambda: (status(coordinator, run) or {}).get("state") == LearnerState.LEARNER_RUNNING, 30,
             "the learner to run")
    etcd_server.stop()
    wait_for(lambda: "etcd unavailable, retrying" in controller_log(run), 20, "the controller to notice the outage")
    assert run.proc.poll() is None and status_is_unknown(coordinator, run)
    etcd_server.restart()
    (run.spec_path.parent / "learner-0" / "go").touch()
    assert run.wait(60) == 0, controller_log(run)
    doc = wait_for(lambda: status(coordinator, run), 30, "the final status after the restart")
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, controller_log(run)
    assert doc["tail"] == ["waiting", "done"]


def status_is_unknown(coordinator, run: Run) -> bool:
    try:
        status(coordinator, run)
    except Exception:  # noqa: BLE001 - etcd is down: that is the point
        return True
    return False


class BrokenStore:
    """An object store failing in a way no adapter anticipates."""

    def get_file(self, key, path):
        raise RuntimeError("disk on fire")

    def put_file(self, key, path):
        raise RuntimeError("disk on fire")


class ListSink:
    def __init__(self):
        self.lines = []

    def write(self, lines):
        self.lines.extend(lines)


def test_a_controller_error_still_ends_in_a_failed_status(coordinator, store_settings, tmp_path):
    spec = LearnerSpec.model_validate({
        "job_id": "j-broken", "attempt": 1, "rank": 0, "world_size": 1,
        "manifest": {"name": "t", "command": "true"}, "code_uri": "store://jobs/j-broken/code.tar.gz",
        "workdir": str(tmp_path / "attempt" / "learner-0"), "lease_ttl": 4})
    sink = ListSink()
    controller = Controller(spec, ControllerSettings(**store_settings.model_dump()), coordinator=coordinator,
                            store=BrokenStore(), sink=sink)
    assert controller.run() == 1
    doc = status(coordinator, Run(None, "j-broken", 0, 1, tmp_path))
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["message"] == "controller error: RuntimeError: disk on fire"
    assert [(ln.stream, ln.line) for ln in sink.lines] == [("system", "controller error: RuntimeError: disk on fire")]


def test_cpu_placement_all_starts_the_learner_on_its_share(launch, coordinator):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.fail(f"placement needs 2 CPUs to test, this process may use {allowed}")
    run = launch({"command": "grep Cpus_allowed_list /proc/self/status", "resources": {"cpus": 1}},
                 place_cpus="all")
    assert run.wait() == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, doc
    assert doc["tail"] == [f"Cpus_allowed_list:\t{allowed[-1]}"]


@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_the_controller_and_its_learner_run_at_the_job_nice(launch, coordinator, isolation):
    # the local backend hands its TF_JOB_NICE to the controllers it starts (common/niceness.py)
    run = launch({"command": "echo ready; sleep 1000"}, isolation=isolation, job_nice=10)
    wait_for(lambda: (status(coordinator, run) or {}).get("state") == LearnerState.LEARNER_RUNNING, 30,
             "the learner to run")
    sleeper = wait_for(lambda: command_processes(run, "sleep"), 30, "the sleep process")[0]
    controller = psutil.Process(run.proc.pid)
    # the learner leads a session of its own (a new autogroup, at nice 0 unless lowered too)
    assert sleeper.pid != controller.pid and os.getsid(sleeper.pid) != os.getsid(controller.pid)
    for proc in (controller, *controller.children(recursive=True)):
        assert proc.nice() == 10, (proc.pid, proc.cmdline())
        assert niceness.autogroup_nice(proc.pid) in (10, None), (proc.pid, proc.cmdline())
    assert "control plane's priority" not in controller_log(run)
    run.proc.send_signal(signal.SIGTERM)
    # at nice 10 it gets a small share of a busy machine's CPU (other tests run on other workers): it stops slowly
    assert run.wait(120) == 0, controller_log(run)

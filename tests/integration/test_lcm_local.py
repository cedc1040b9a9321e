"""The lifecycle on the local backend against real etcd, with a fake interpreter standing in for controllers.

`python` in the LCM settings points at a small script written per test: it
records its argv, working directory and environment, then sleeps until it
is signalled, so spawning, idempotency, GPU allocation, adoption and kill can
be checked without the controller. One test lets the real job monitor run,
to show the monitor the LCM starts reaches the same etcd as the LCM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from services.common.errors import Conflict, ResourceExhausted
from services.common.manifest import Manifest
from services.common.settings import LcmSettings
from services.lcm.backends.base import Handle, Role
from services.lcm.backends.local import LocalBackend
from services.lcm.lifecycle import JobDeployment, Lifecycle
from tests.integration.conftest import backend_maker
from tests.servers import wait_for

FAKE_PYTHON = """#!{python}
import json, os, signal, subprocess, sys, time

argv = sys.argv[1:]
module = argv[1] if len(argv) > 1 else ""
mode = os.environ.get("FAKE_MODE", "sleep")
record = {{"argv": argv, "cwd": os.getcwd(), "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
          "env": {{k: v for k, v in os.environ.items() if k.startswith("TF_") or k == "PYTHONPATH"}}}}
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "learner" and module == "services.controller":
    record["child"] = subprocess.Popen(["sleep", "600"], start_new_session=True).pid
out = os.path.join(os.environ["FAKE_DIR"], f"{{os.getpid()}}.json")
with open(out + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(out + ".tmp", out)
if module == "services.jobmonitor" and os.environ.get("FAKE_REAL_MONITOR"):
    os.execv({python!r}, [{python!r}] + argv)
while True:
    time.sleep(0.2)
"""


class Fake:
    """The fake interpreter and what its processes recorded."""

    def __init__(self, tmp_path: Path):
        self.dir = tmp_path / "fake-runs"
        self.dir.mkdir()
        self.python = tmp_path / "fakepython"
        self.python.write_text(FAKE_PYTHON.format(python=sys.executable))
        self.python.chmod(0o755)

    def runs(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.dir.glob("*.json"))]

    def run_of(self, pid: int) -> dict:
        return json.loads((self.dir / f"{pid}.json").read_text())

    def wait_runs(self, n: int) -> list[dict]:
        return wait_for(lambda: len(self.runs()) >= n and self.runs(), 20, f"{n} fake process(es) to start")

    def cleanup(self) -> None:
        for run in self.runs():
            for pid in (run["pid"], run.get("child")):
                if pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def fake(tmp_path, monkeypatch):
    f = Fake(tmp_path)
    monkeypatch.setenv("FAKE_DIR", str(f.dir))
    yield f
    f.cleanup()


@pytest.fixture
def lcm_settings(tmp_path, etcd_server, coordinator, fake):
    def make(**kw) -> LcmSettings:
        values = dict(state_dir=tmp_path / "state", etcd_endpoints=etcd_server.address,
                      etcd_prefix=coordinator.keys.prefix, python=str(fake.python), local_gpus=0,
                      lcm_address="127.0.0.1:0", trainer_address="127.0.0.1:1", lease_ttl=7)
        return LcmSettings(**{**values, **kw})

    return make


@pytest.fixture
def lifecycles(lcm_settings, coordinator):
    def build(kill_grace: float = 5.0, supervise_interval: float = 2.0, **kw) -> Lifecycle:
        settings = lcm_settings(**kw)
        return Lifecycle.from_settings(settings, LocalBackend(settings, kill_grace=kill_grace), coordinator,
                                       start_timeout=30, supervise_interval=supervise_interval)

    yield from backend_maker(build)


def deployment(job_id: str, attempt: int = 1, learners: int = 2, gpus: int = 0, **kw) -> JobDeployment:
    manifest = Manifest(name="mnist-ddp", learners=learners, command="python train.py",
                        resources={"gpus": gpus, "cpus": 1, "memory": "1Gi"})
    return JobDeployment(job_id=job_id, team="team-a", attempt=attempt, manifest=manifest, **kw)


def pids_of(handles: list[Handle]) -> list[int]:
    return [int(h.ref) for h in handles]


def names(handles: list[Handle]) -> list[str]:
    return [h.name for h in handles]


def test_deploy_writes_the_specs_and_the_attempt_key_and_starts_monitor_and_controllers(
        lifecycles, fake, coordinator, tmp_path, unique, monkeypatch):
    monkeypatch.setenv("TF_STACK_ID", f"stack-{unique}")
    lcm = lifecycles()
    job = f"j-{unique}"
    handles = lcm.deploy(deployment(job, code_uri=f"store://jobs/{job}/code.tar.gz",
                                        checkpoint_uri="store://ckpt/7"))
    assert names(handles) == ["monitor", "controller-0", "controller-1"]

    attempt_dir = (tmp_path / "state" / "work" / job / "1").resolve()
    assert json.loads((attempt_dir / "monitor.json").read_text()) == {
        "job_id": job, "team": "team-a", "attempt": 1, "learners": 2, "start_timeout": 30}
    spec0 = json.loads((attempt_dir / "learner-0.json").read_text())
    spec1 = json.loads((attempt_dir / "learner-1.json").read_text())
    assert spec0 == {
        "job_id": job, "team": "team-a", "attempt": 1, "rank": 0, "world_size": 2,
        "manifest": deployment(job).manifest.model_dump(mode="json"),
        "code_uri": f"store://jobs/{job}/code.tar.gz", "checkpoint_uri": "store://ckpt/7",
        "workdir": str(attempt_dir / "learner-0"), "master_addr": "127.0.0.1",
        "master_port": spec0["master_port"], "gpu_ids": [], "lease_ttl": 7}
    assert spec1["rank"] == 1 and spec1["workdir"] == str(attempt_dir / "learner-1")
    assert spec1["master_port"] == spec0["master_port"] > 0
    assert (attempt_dir / "learner-0").is_dir()
    assert coordinator.get(coordinator.keys.attempt(job))[0] == {
        "attempt": 1, "learners": 2, "checkpoint_uri": "store://ckpt/7"}

    fake.wait_runs(3)
    by_pid = {r["pid"]: r for r in fake.runs()}
    monitor_pid, c0, c1 = pids_of(handles)
    assert by_pid[monitor_pid]["argv"] == ["-m", "services.jobmonitor", "--spec", str(attempt_dir / "monitor.json")]
    assert by_pid[c0]["argv"] == ["-m", "services.controller", "--spec", str(attempt_dir / "learner-0.json")]
    assert by_pid[c1]["argv"] == ["-m", "services.controller", "--spec", str(attempt_dir / "learner-1.json")]
    repo = Path(__file__).resolve().parents[2]
    for run in by_pid.values():
        assert run["cwd"] == str(attempt_dir)
        assert run["sid"] == run["pid"] == run["pgid"], "not started in its own session"
        assert run["env"]["TF_ETCD_PREFIX"] == coordinator.keys.prefix
        assert run["env"]["TF_TRAINER_ADDRESS"] == "127.0.0.1:1"
        assert run["env"]["TF_STATE_DIR"] == str(tmp_path / "state")
        assert run["env"]["TF_LEASE_TTL"] == "7"
        assert run["env"]["TF_STACK_ID"] == f"stack-{unique}"
        assert run["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(repo)
    assert (attempt_dir / "monitor.log").exists() and (attempt_dir / "controller-1.log").exists()

    # the lifecycle records the plan; the backend the processes it started (pid and start time)
    record = json.loads((tmp_path / "state" / "lcm" / "jobs" / f"{job}.json").read_text())
    assert record["plan"]["attempt"] == 1 and len(record["plan"]["learners"]) == 2
    processes = json.loads((tmp_path / "state" / "lcm" / "local" / f"{job}.json").read_text())["processes"]
    assert [(p["role"], p["rank"], p["pid"]) for p in processes] == [
        ("monitor", None, monitor_pid), ("controller", 0, c0), ("controller", 1, c1)]
    assert all(p["started"] > 0 for p in processes)


def test_deploy_is_idempotent_per_attempt(lifecycles, fake, unique):
    lcm = lifecycles()
    job = f"j-{unique}"
    first = lcm.deploy(deployment(job))
    fake.wait_runs(3)
    assert lcm.deploy(deployment(job)) == first
    assert len(fake.runs()) == 3
    assert [(j.job_id, j.attempt, j.learners, j.handles) for j in lcm.running_jobs()] == [(job, 1, 2, first)]


def test_kill_stops_every_process_and_removes_the_etcd_keys_and_the_record(
        lifecycles, fake, coordinator, tmp_path, unique):
    lcm = lifecycles()
    job, other = f"j-{unique}", f"k-{unique}"
    pids = pids_of(lcm.deploy(deployment(job)))
    other_pids = pids_of(lcm.deploy(deployment(other, learners=1)))
    fake.wait_runs(5)
    coordinator.put(coordinator.keys.learner_status(job, 0), {"state": 2, "attempt": 1})
    assert all(psutil.pid_exists(p) for p in pids)

    assert lcm.kill(job) == 3
    assert all(gone(p) for p in pids)
    assert coordinator.list(coordinator.keys.job(job))[0] == {}
    assert not (tmp_path / "state" / "lcm" / "jobs" / f"{job}.json").exists()
    assert [j.job_id for j in lcm.running_jobs()] == [other]
    assert not any(gone(p) for p in other_pids)
    assert coordinator.get(coordinator.keys.attempt(other))[0] is not None
    assert lcm.kill(job) == 0, "kill is idempotent"
    assert lcm.kill(f"never-{unique}") == 0


def test_kill_escalates_to_sigkill_after_the_grace_period(lifecycles, fake, unique, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "ignore-term")
    lcm = lifecycles(kill_grace=0.5)
    pids = pids_of(lcm.deploy(deployment(f"j-{unique}", learners=1)))
    fake.wait_runs(2)
    assert lcm.kill(f"j-{unique}") == 2
    assert all(gone(p) for p in pids)


def test_kill_reaches_a_learner_running_in_its_own_session(lifecycles, fake, unique, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "learner")
    lcm = lifecycles()
    lcm.deploy(deployment(f"j-{unique}", learners=1))
    runs = fake.wait_runs(2)
    learner = next(r["child"] for r in runs if "child" in r)
    assert not gone(learner)
    lcm.kill(f"j-{unique}")
    wait_for(lambda: gone(learner), 10, "the learner to be gone")


def test_a_later_attempt_replaces_the_running_one_and_an_earlier_one_conflicts(
        lifecycles, fake, coordinator, unique):
    lcm = lifecycles()
    job = f"j-{unique}"
    old = pids_of(lcm.deploy(deployment(job, attempt=1)))
    fake.wait_runs(3)
    coordinator.put(coordinator.keys.halt(job), {"attempt": 1})
    new = pids_of(lcm.deploy(deployment(job, attempt=2, checkpoint_uri="store://ckpt/1")))
    assert all(gone(p) for p in old)
    assert not any(gone(p) for p in new)
    assert coordinator.get(coordinator.keys.halt(job))[0] is None, "the old attempt's keys outlived it"
    assert coordinator.get(coordinator.keys.attempt(job))[0]["attempt"] == 2
    with pytest.raises(Conflict, match="attempt 1 is older than the deployed attempt 2"):
        lcm.deploy(deployment(job, attempt=1))


def test_a_resent_deploy_of_an_attempt_whose_processes_died_starts_only_its_monitor_again(
        lifecycles, fake, tmp_path, unique):
    lcm = lifecycles(supervise_interval=600)
    job = f"j-{unique}"
    monitor, controller = pids_of(lcm.deploy(deployment(job, learners=1)))
    fake.wait_runs(2)
    for pid in (monitor, controller):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: lcm.running_jobs() == [], 10, "the dead processes to be noticed")
    # never a second run of the same attempt: the monitor finds out from etcd how it ended
    again = lcm.deploy(deployment(job, learners=1))
    assert names(again) == ["controller-0", "monitor"]
    assert pids_of(again)[0] == controller and pids_of(again)[1] not in (monitor, controller)
    assert not gone(pids_of(again)[1])
    fake.wait_runs(3)

    # an attempt whose monitor had finished is over: asked again, it is deployed afresh
    os.kill(pids_of(again)[1], signal.SIGKILL)
    wait_for(lambda: lcm.running_jobs() == [], 10, "the dead processes to be noticed")
    done = tmp_path / "state" / "work" / job / "1" / "monitor.done"
    done.touch()
    fresh = pids_of(lcm.deploy(deployment(job, learners=1)))
    assert set(fresh).isdisjoint([monitor, controller, *pids_of(again)])
    assert not any(gone(p) for p in fresh)
    assert not done.exists(), "the redone attempt inherited the old monitor's marker"


def test_gpus_are_handed_out_once_and_freed_by_kill(lifecycles, fake, tmp_path, unique):
    lcm = lifecycles(local_gpus=3)
    a, b = f"a-{unique}", f"b-{unique}"

    def spec(job: str, rank: int) -> dict:
        return json.loads((tmp_path / "state" / "work" / job / "1" / f"learner-{rank}.json").read_text())

    lcm.deploy(deployment(a, learners=2, gpus=1))
    assert (spec(a, 0)["gpu_ids"], spec(a, 1)["gpu_ids"]) == ([0], [1])
    with pytest.raises(ResourceExhausted, match=r"needs 2 GPU\(s\); the local backend has 1 of 3 free"):
        lcm.deploy(deployment(b, learners=1, gpus=2))
    lcm.deploy(deployment(b, learners=1, gpus=1))
    assert spec(b, 0)["gpu_ids"] == [2]
    lcm.kill(a)
    lcm.kill(b)
    lcm.deploy(deployment(b, learners=1, gpus=3))
    assert spec(b, 0)["gpu_ids"] == [0, 1, 2]


def test_max_learners_is_enforced(lifecycles, fake, unique):
    lcm = lifecycles(local_max_learners=3)
    lcm.deploy(deployment(f"a-{unique}", learners=2))
    with pytest.raises(ResourceExhausted, match="runs at most 3 and 2 are running"):
        lcm.deploy(deployment(f"b-{unique}", learners=2))
    lcm.deploy(deployment(f"b-{unique}", learners=1))


def test_a_new_backend_adopts_live_deployments_and_forgets_finished_ones(lifecycles, fake, tmp_path, unique):
    first = lifecycles()
    live, dead, unwatched = f"live-{unique}", f"dead-{unique}", f"unwatched-{unique}"
    handles = first.deploy(deployment(live))
    dead_pids = pids_of(first.deploy(deployment(dead, learners=1)))
    unwatched_pids = pids_of(first.deploy(deployment(unwatched, learners=1)))
    fake.wait_runs(7)
    first.close()
    (tmp_path / "state" / "work" / dead / "1" / "monitor.done").touch()  # its monitor delivered the end
    for pid in dead_pids + unwatched_pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(gone(p) for p in dead_pids + unwatched_pids), 10, "the killed processes to exit")

    second = lifecycles(supervise_interval=600)  # the LCM restarted: a fresh lifecycle and backend on the same state dir
    assert [(j.job_id, j.handles) for j in second.running_jobs()] == [(live, handles)]
    records = tmp_path / "state" / "lcm" / "jobs"
    assert not (records / f"{dead}.json").exists()
    # every process of this one died unwatched before its monitor finished: its monitor is started again
    assert (records / f"{unwatched}.json").exists()
    second.supervise_once()
    revived = monitor_pid(second, unwatched)
    assert revived is not None and revived not in unwatched_pids
    assert second.deploy(deployment(live)) == handles
    assert len(fake.wait_runs(8)) == 8
    assert second.kill(live) == 3
    assert all(gone(p) for p in pids_of(handles))
    assert second.kill(unwatched) == 1
    assert gone(revived)


def test_capacity_reports_settings_or_the_machine(lifecycles, fake):
    assert lifecycles(local_cpus=6, local_memory=8 * 2**30, local_gpus=2, local_max_learners=5).capacity() \
        .__dict__ == {"backend": "local", "gpus": 2, "cpus": 6.0, "memory": 8 * 2**30, "max_learners": 5}
    cap = lifecycles().capacity()
    assert (cap.cpus, cap.memory, cap.gpus) == (float(os.cpu_count()), psutil.virtual_memory().total, 0)


def test_the_monitor_started_by_deploy_claims_the_job_in_the_same_etcd(
        lifecycles, fake, coordinator, unique, monkeypatch):
    monkeypatch.setenv("FAKE_REAL_MONITOR", "1")
    lcm = lifecycles()
    job = f"j-{unique}"
    monitor_pid = pids_of(lcm.deploy(deployment(job)))[0]
    claim = wait_for(lambda: coordinator.get(coordinator.keys.monitor(job))[0], 30, "the monitor's claim")
    assert claim["pid"] == monitor_pid and claim["attempt"] == 1
    assert lcm.kill(job) == 3
    assert gone(monitor_pid)
    assert coordinator.get(coordinator.keys.monitor(job))[0] is None


def test_a_python_that_cannot_start_fails_the_deploy_and_leaves_nothing(lifecycles, tmp_path, unique):
    lcm = lifecycles(python=str(tmp_path / "no-such-python"))
    with pytest.raises(Exception, match="cannot start the monitor"):
        lcm.deploy(deployment(f"j-{unique}"))
    assert lcm.running_jobs() == []
    assert not (tmp_path / "state" / "lcm" / "jobs" / f"j-{unique}.json").exists()


def monitor_pid(lcm: Lifecycle, job: str) -> int | None:
    return next((int(h.ref) for j in lcm.running_jobs() if j.job_id == job
                 for h in j.handles if h.role is Role.MONITOR), None)


def test_a_monitor_that_died_before_its_attempt_ended_is_started_again(lifecycles, fake, unique, tmp_path):
    lcm = lifecycles(supervise_interval=0.1)
    job = f"j-{unique}"
    lcm.deploy(deployment(job, learners=1))
    fake.wait_runs(2)
    first = monitor_pid(lcm, job)
    os.kill(first, signal.SIGKILL)
    second = wait_for(lambda: (p := monitor_pid(lcm, job)) not in (None, first) and p, 20,
                      "a new monitor")
    run = wait_for(lambda: fake.run_of(second), 10, "the new monitor to start")
    assert run["argv"][1] == "services.jobmonitor" and run["argv"][-1].endswith("monitor.json")
    # one that finished its work (monitor.done) is left alone
    (tmp_path / "state" / "work" / job / "1" / "monitor.done").touch()
    os.kill(second, signal.SIGKILL)
    wait_for(lambda: gone(second), 10, "the monitor to die")
    runs = len(fake.runs())
    for _ in range(3):
        lcm.supervise_once()
    assert monitor_pid(lcm, job) == second and len(fake.runs()) == runs  # none started


def test_a_deploy_cut_short_is_completed_when_asked_again(lifecycles, fake, unique):
    lcm = lifecycles(supervise_interval=600)
    job = f"j-{unique}"
    first = lcm.deploy(deployment(job, learners=2))
    fake.wait_runs(3)
    # as if the LCM died after starting the monitor and controller 0 only
    records = lcm.backend._records
    record = records.get(job)
    lost = next(e for e in record.processes if e.handle.name == "controller-1")
    os.kill(lost.pid, signal.SIGKILL)
    records.put(record.model_copy(update={"processes": tuple(e for e in record.processes if e != lost)}))
    again = lcm.deploy(deployment(job, learners=2))
    assert set(again).isdisjoint(first)
    assert sorted(names(again)) == ["controller-0", "controller-1", "monitor"]


def test_a_controller_that_died_without_a_status_is_reported_failed(lifecycles, fake, coordinator, unique):
    lcm = lifecycles(supervise_interval=0.1)
    job = f"j-{unique}"
    lcm.deploy(deployment(job, learners=2))
    fake.wait_runs(3)
    # controller 1 wrote a status before it died: that one stands
    coordinator.put(coordinator.keys.learner_status(job, 1), {"state": 4, "attempt": 1, "exit_code": 0})
    for handle in lcm.view(job).handles:
        if handle.role is Role.CONTROLLER:
            os.kill(int(handle.ref), signal.SIGKILL)
    doc = wait_for(lambda: coordinator.get(coordinator.keys.learner_status(job, 0))[0], 20,
                   "controller 0's learner to be reported")
    assert (doc["state"], doc["attempt"]) == (5, 1)
    assert "ended without reporting the learner" in doc["message"]
    assert coordinator.get(coordinator.keys.learner_status(job, 1))[0]["state"] == 4


def test_a_dead_controllers_leased_status_is_replaced_by_a_failure_once_it_expires(
        lifecycles, fake, coordinator, unique):
    # A monitor started after the lease ran out never saw the learner: without the failure the LCM
    # writes it would wait out its whole start timeout.
    lcm = lifecycles(supervise_interval=600)
    job = f"j-{unique}"
    lcm.deploy(deployment(job, learners=1))
    fake.wait_runs(2)
    key = coordinator.keys.learner_status(job, 0)
    coordinator.put(key, {"state": 2, "attempt": 1}, lease=coordinator.grant_lease(2))
    controller = next(int(h.ref) for h in lcm.view(job).handles if h.name == "controller-0")
    os.kill(controller, signal.SIGKILL)
    wait_for(lambda: gone(controller), 10, "the controller to die")
    lcm.supervise_once()
    assert coordinator.get(key)[0]["state"] == 2, "the leased status was overwritten before it expired"
    wait_for(lambda: coordinator.get(key)[0] is None, 15, "the controller's lease to expire")
    lcm.supervise_once()
    doc = coordinator.get(key)[0]
    assert (doc["state"], doc["attempt"]) == (5, 1) and "ended without reporting" in doc["message"]


def test_a_kill_an_lcm_crash_cut_short_is_never_revived(lifecycles, fake, tmp_path, unique):
    first = lifecycles(supervise_interval=600)
    job = f"j-{unique}"
    pids = pids_of(first.deploy(deployment(job, learners=1)))
    fake.wait_runs(2)
    first.mark_killing(job)  # as if the LCM died inside kill(), after stopping them
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(gone(p) for p in pids), 10, "the processes to exit")
    first.close()

    second = lifecycles(supervise_interval=600)
    second.supervise_once()
    assert not (tmp_path / "state" / "lcm" / "jobs" / f"{job}.json").exists()
    assert len(fake.runs()) == 2, "a monitor of a job being killed was started again"
    assert second.kill(job) == 0

"""Fixtures for the lifecycle on the local backend, with a fake interpreter standing in for controllers.

`python` in the LCM settings points at a small script written per test: it
records its argv, working directory and environment, then sleeps until it
is signalled, so spawning, idempotency, GPU allocation, adoption and kill can
be checked without the controller.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import backend_maker
from tests.servers import wait_for
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.backends.base import Handle, Role
from trainforge_services.lcm.backends.local import LocalBackend
from trainforge_services.lcm.lifecycle import JobDeployment, LifecycleManager

FAKE_PYTHON = """#!{python}
import json, os, signal, subprocess, sys, time

argv = sys.argv[1:]
module = argv[1] if len(argv) > 1 else ""
mode = os.environ.get("FAKE_MODE", "sleep")
record = {{"argv": argv, "cwd": os.getcwd(), "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
          "env": {{k: v for k, v in os.environ.items() if k.startswith("TF_") or k == "PYTHONPATH"}}}}
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "learner" and module == "trainforge_services.controller":
    record["child"] = subprocess.Popen(["sleep", "600"], start_new_session=True).pid
out = os.path.join(os.environ["FAKE_DIR"], f"{{os.getpid()}}.json")
with open(out + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(out + ".tmp", out)
if module == "trainforge_services.jobmonitor" and os.environ.get("FAKE_REAL_MONITOR"):
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
    def build(kill_grace: float = 5.0, supervise_interval: float = 2.0, **kw) -> LifecycleManager:
        settings = lcm_settings(**kw)
        return LifecycleManager.from_settings(settings, LocalBackend(settings, kill_grace=kill_grace), coordinator,
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


def monitor_pid(lcm: LifecycleManager, job: str) -> int | None:
    return next((int(h.ref) for j in lcm.running_jobs() if j.job_id == job
                 for h in j.handles if h.role is Role.MONITOR), None)

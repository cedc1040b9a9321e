"""The lifecycle's supervision on the local backend, with the real job monitor and controllers, real etcd and a fake Trainer.

The other LCM tests use a fake interpreter; here every process is the real
one, so what is checked is what a crash looks like from the outside: a
job monitor SIGKILLed mid-run is started again, waits out its predecessor's
lease, and reports the attempt's end; one killed while no LCM runs is
started by the next LCM; and KillJob removes a learner whose controller
was SIGKILLed, also one that left its process group (nothing the
controller arranged for its own death reaches that one).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import backend_maker
from tests.integration.test_monitor_process import start_trainer
from tests.servers import free_port, wait_for
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.settings import LcmSettings
from trainforge_services.common.states import JobState, LearnerState
from trainforge_services.lcm.backends.base import Role
from trainforge_services.lcm.backends.local import LocalBackend
from trainforge_services.lcm.lifecycle import JobDeployment, LifecycleManager

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def trainer():
    server, fake = start_trainer(port := free_port())
    fake.address = f"127.0.0.1:{port}"
    yield fake
    server.stop(0).wait()


@pytest.fixture
def make_backend(store_settings, coordinator, trainer):
    def build(**kw) -> LifecycleManager:
        settings = LcmSettings(**{**store_settings.model_dump(), "trainer_address": trainer.address,
                                  "python": sys.executable, "local_gpus": 0, "lease_ttl": 3, **kw})
        return LifecycleManager.from_settings(settings, LocalBackend(settings, kill_grace=5), coordinator,
                                       start_timeout=60, supervise_interval=0.2)

    yield from backend_maker(build)


def deployment(job_id: str, command: str, learners: int = 1) -> JobDeployment:
    manifest = Manifest(name="supervised", framework="custom", learners=learners, command=command,
                        resources={"cpus": 0.25, "memory": "128Mi"})
    return JobDeployment(job_id=job_id, team="team-a", attempt=1, manifest=manifest)


def states(trainer, job: str) -> list[JobState]:
    return [JobState(r.state) for r in list(trainer.reports) if r.job_id == job]


def monitor_of(backend: LifecycleManager, job: str) -> int | None:
    return next((int(h.ref) for j in backend.running_jobs() if j.job_id == job
                 for h in j.handles if h.role is Role.MONITOR), None)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def learners_of(job: str) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TF_JOB_ID") == job and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def sleeper(seconds: float) -> str:
    return f"python -c \"import time; time.sleep({seconds})\""


def test_a_killed_monitor_is_started_again_and_reports_the_end_once(make_backend, trainer, coordinator, unique,
                                                                    store_settings):
    backend = make_backend()
    job = f"sup-{unique}"
    backend.deploy(deployment(job, sleeper(6)))
    wait_for(lambda: JobState.RUNNING in states(trainer, job), 60, "the job to run")
    first = monitor_of(backend, job)
    os.kill(first, signal.SIGKILL)
    # read while the job runs: a monitor exits as soon as it delivered the end, and with it the handle goes
    second = wait_for(lambda: (m := monitor_of(backend, job)) not in (None, first) and m, 60,
                      "supervision to start a new monitor")

    wait_for(lambda: JobState.COMPLETED in states(trainer, job), 60, "the restarted monitor to report the end")
    attempt_dir = Path(store_settings.state_dir).resolve() / "work" / job / "1"
    wait_for(lambda: (attempt_dir / "monitor.done").exists(), 20, "the new monitor to leave monitor.done")
    wait_for(lambda: gone(second), 20, "the new monitor to exit")
    # the Trainer takes repeated reports idempotently; the end itself is reported once
    assert states(trainer, job).count(JobState.COMPLETED) == 1
    for _ in range(3):
        backend.supervise_once()
    assert monitor_of(backend, job) is None, "a monitor that finished was started again"
    assert backend.kill(job) == 0
    assert coordinator.list(coordinator.keys.job(job))[0] == {}


def test_a_monitor_killed_while_no_lcm_ran_is_started_by_the_next_lcm(make_backend, trainer, coordinator, unique):
    first = make_backend()
    job = f"unw-{unique}"
    first.deploy(deployment(job, sleeper(2), learners=2))
    wait_for(lambda: JobState.RUNNING in states(trainer, job), 60, "the job to run")
    monitor = monitor_of(first, job)
    first.close()  # the LCM is gone ...
    os.kill(monitor, signal.SIGKILL)  # ... and so is the monitor, while the learners finish unwatched

    def completed() -> bool:
        docs = coordinator.list(coordinator.keys.learners(job))[0]
        return sum(d.get("state") == LearnerState.LEARNER_COMPLETED for d in docs.values()) == 2

    wait_for(completed, 60, "both learners to complete")
    wait_for(lambda: not learners_of(job) and not any(
        "trainforge_services.controller" in " ".join(p.cmdline()) and job in " ".join(p.cmdline())
        for p in psutil.process_iter() if p.status() != psutil.STATUS_ZOMBIE), 30, "the controllers to exit")
    second = make_backend()
    wait_for(lambda: JobState.COMPLETED in states(trainer, job), 60, "the next LCM's monitor to report the end")
    assert states(trainer, job).count(JobState.COMPLETED) == 1
    second.kill(job)


def test_kill_removes_a_learner_whose_controller_was_sigkilled(make_backend, unique, monkeypatch):
    # In a sandbox such a learner dies with its PID namespace (tests/integration/test_sandbox_policy.py);
    # without one only the backend's stop finds it, which is what this checks.
    monkeypatch.setenv("TF_ISOLATION", "none")
    backend = make_backend()
    job = f"orph-{unique}"
    # a learner that leaves its process group (its own session): whatever the controller does to the
    # group when it dies does not reach it; it still carries the job's environment
    backend.deploy(deployment(job, f"setsid {sleeper(300)}"))

    def sleeping() -> psutil.Process | None:
        return next((p for p in learners_of(job) if p.cmdline()[:2] == ["python", "-c"]), None)

    learner = wait_for(sleeping, 60, "the learner to start")
    try:
        controller = next(int(h.ref) for j in backend.running_jobs() for h in j.handles
                          if h.name == "controller-0")
        os.kill(controller, signal.SIGKILL)
        wait_for(lambda: gone(controller), 10, "the controller to die")
        assert not gone(learner.pid), "the learner died with its controller: this test checks nothing"

        assert backend.kill(job) >= 1
        wait_for(lambda: gone(learner.pid), 10, "the orphaned learner to be killed")
        assert learners_of(job) == []
        assert backend.kill(job) == 0
    finally:
        for proc in learners_of(job):
            proc.kill()

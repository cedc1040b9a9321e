"""The lifecycle on the local backend after crashes: adoption, monitor restarts, dead controllers, cut-short kills."""
from __future__ import annotations

import gc
import os
import signal
import sys

import psutil
import pytest

from tests.integration.lcm_local.conftest import deployment, gone, monitor_pid, names, pids_of
from tests.servers import wait_for
from trainforge_services.lcm.backends.base import Role
from trainforge_services.lcm.backends.local.backend import LocalBackend
from trainforge_services.lcm.lifecycle import LifecycleManager


def test_a_new_backend_adopts_live_deployments_and_keeps_ended_ones_until_killed(lifecycles, fake, tmp_path, unique):
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
    # one that ended is kept until its KillJob: a deploy of it resent late starts nothing
    assert (records / f"{dead}.json").exists()
    assert pids_of(second.deploy(deployment(dead, learners=1))) == dead_pids
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
    assert second.kill(dead) == 0 and not (records / f"{dead}.json").exists()


def test_capacity_reports_settings_or_the_machine(lifecycles, fake):
    assert lifecycles(local_cpus=6, local_memory=8 * 2**30, local_gpus=2, local_max_learners=5).capacity() \
        .__dict__ == {"backend": "local", "gpus": 2, "cpus": 6.0, "memory": 8 * 2**30, "max_learners": 5,
                     "network_policy": ""}  # the local backend runs no NetworkPolicies: nothing to report
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
    assert run["argv"][1] == "trainforge_services.jobmonitor" and run["argv"][-1].endswith("monitor.json")
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


def test_a_closed_backend_leaves_its_processes_running_and_still_collects_them_when_they_end(
        lcm_settings, coordinator, fake, unique):
    settings = lcm_settings()  # the fake interpreter is not the LCM's: every process is spawned, a child of ours
    lcm = LifecycleManager.from_settings(settings, LocalBackend(settings, kill_grace=5), coordinator,
                                         start_timeout=30, supervise_interval=600)
    pids = pids_of(lcm.deploy(deployment(f"left-{unique}", learners=1)))
    fake.wait_runs(2)
    lcm.close()
    del lcm
    dropped: list = []
    hook, sys.unraisablehook = sys.unraisablehook, dropped.append
    try:
        gc.collect()  # a Popen dropped while its process runs would warn here
    finally:
        sys.unraisablehook = hook
    assert not [u for u in dropped if isinstance(u.exc_value, ResourceWarning)], dropped
    assert all(psutil.pid_exists(p) and not gone(p) for p in pids)  # left running by design
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # collected, not left as zombies of this process
    wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), 10, "the ended processes to be collected")

"""The lifecycle on the local backend: deploy, idempotency, kill, replacement, GPUs and capacity.

One test lets the real job monitor run, to show the monitor the LCM starts
reaches the same etcd as the LCM.
"""
from __future__ import annotations

import json
import os
import signal

import psutil
import pytest

from tests.integration.lcm_local.conftest import deployment, gone, names, pids_of
from tests.servers import wait_for
from trainforge_services.common.errors import Conflict, ResourceExhausted


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
    assert by_pid[monitor_pid]["argv"] == ["-m", "trainforge_services.jobmonitor", "--spec", str(attempt_dir / "monitor.json")]
    assert by_pid[c0]["argv"] == ["-m", "trainforge_services.controller", "--spec", str(attempt_dir / "learner-0.json")]
    assert by_pid[c1]["argv"] == ["-m", "trainforge_services.controller", "--spec", str(attempt_dir / "learner-1.json")]
    for run in by_pid.values():
        assert run["cwd"] == str(attempt_dir)
        assert run["sid"] == run["pid"] == run["pgid"], "not started in its own session"
        assert run["env"]["TF_ETCD_PREFIX"] == coordinator.keys.prefix
        assert run["env"]["TF_TRAINER_ADDRESS"] == "127.0.0.1:1"
        assert run["env"]["TF_STATE_DIR"] == str(tmp_path / "state")
        assert run["env"]["TF_LEASE_TTL"] == "7"
        assert run["env"]["TF_JOB_NICE"] == "0"  # the default: the services' priority (common/niceness.py)
        assert run["env"]["TF_STACK_ID"] == f"stack-{unique}"
        # the interpreter imports the platform from its installation: our PYTHONPATH passes through unchanged
        assert run["env"].get("PYTHONPATH") == os.environ.get("PYTHONPATH")
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


def test_a_killed_attempt_resent_after_its_kill_starts_nothing_even_after_a_restart(
        lifecycles, fake, coordinator, tmp_path, unique):
    lcm = lifecycles(supervise_interval=600)
    job = f"j-{unique}"
    pids = pids_of(lcm.deploy(deployment(job, attempt=2, learners=1)))
    fake.wait_runs(2)
    assert lcm.kill(job) == 2 and all(gone(p) for p in pids)
    mark, meta = coordinator._client.get(coordinator.keys.killed(job))  # noqa: SLF001 - the key's lease
    assert json.loads(mark)["attempt"] == 2
    assert 3500 < coordinator._client.get_lease_info(meta.lease_id).TTL <= 3600  # noqa: SLF001
    assert coordinator.list(coordinator.keys.job(job))[0] == {}

    # a deploy of that attempt still in flight through the KillJob (its answer lost, resent)
    with pytest.raises(Conflict, match=f"job {job} attempt 2 was killed; a new run needs attempt 3"):
        lcm.deploy(deployment(job, attempt=2, learners=1))
    lcm.close()
    # the next LCM (restarted, or a new leader on the same etcd) knows it too
    again = lifecycles(supervise_interval=600)
    for attempt in (2, 1):
        with pytest.raises(Conflict, match="attempt 2 was killed"):
            again.deploy(deployment(job, attempt=attempt, learners=1))
    assert len(fake.runs()) == 2 and again.running_jobs() == []
    assert coordinator.get(coordinator.keys.attempt(job))[0] is None
    assert not (tmp_path / "state" / "lcm" / "jobs" / f"{job}.json").exists()
    # the job's next attempt deploys
    fresh = pids_of(again.deploy(deployment(job, attempt=3, learners=1)))
    fake.wait_runs(4)
    assert not any(gone(p) for p in fresh) and set(fresh).isdisjoint(pids)
    assert coordinator.get(coordinator.keys.attempt(job))[0]["attempt"] == 3


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


def test_a_resent_deploy_of_a_dead_attempt_starts_only_its_monitor_and_of_an_ended_one_nothing(
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

    # an attempt whose monitor had finished is over: asked again, nothing starts (the Trainer reruns a job only
    # as a later attempt)
    os.kill(pids_of(again)[1], signal.SIGKILL)
    wait_for(lambda: lcm.running_jobs() == [], 10, "the dead processes to be noticed")
    done = tmp_path / "state" / "work" / job / "1" / "monitor.done"
    done.touch()
    runs = len(fake.runs())
    assert pids_of(lcm.deploy(deployment(job, learners=1))) == pids_of(again)
    assert lcm.running_jobs() == [] and len(fake.runs()) == runs
    # its next attempt starts afresh
    fresh = pids_of(lcm.deploy(deployment(job, attempt=2, learners=1)))
    assert set(fresh).isdisjoint([monitor, controller, *pids_of(again)])
    assert not any(gone(p) for p in fresh)


def test_gpus_are_handed_out_once_and_freed_by_kill(lifecycles, fake, tmp_path, unique):
    lcm = lifecycles(local_gpus=3)
    a, b = f"a-{unique}", f"b-{unique}"

    def spec(job: str, rank: int, attempt: int = 1) -> dict:
        path = tmp_path / "state" / "work" / job / str(attempt) / f"learner-{rank}.json"
        return json.loads(path.read_text())

    lcm.deploy(deployment(a, learners=2, gpus=1))
    assert (spec(a, 0)["gpu_ids"], spec(a, 1)["gpu_ids"]) == ([0], [1])
    with pytest.raises(ResourceExhausted, match=r"needs 2 GPU\(s\); the local backend has 1 of 3 free"):
        lcm.deploy(deployment(b, learners=1, gpus=2))
    lcm.deploy(deployment(b, learners=1, gpus=1))
    assert spec(b, 0)["gpu_ids"] == [2]
    lcm.kill(a)
    lcm.kill(b)
    lcm.deploy(deployment(b, attempt=2, learners=1, gpus=3))  # a killed attempt never runs again: the next one
    assert spec(b, 0, attempt=2)["gpu_ids"] == [0, 1, 2]


def test_max_learners_is_enforced(lifecycles, fake, unique):
    lcm = lifecycles(local_max_learners=3)
    lcm.deploy(deployment(f"a-{unique}", learners=2))
    with pytest.raises(ResourceExhausted, match="runs at most 3 and 2 are running"):
        lcm.deploy(deployment(f"b-{unique}", learners=2))
    lcm.deploy(deployment(f"b-{unique}", learners=1))

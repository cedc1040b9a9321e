"""The local backend's recognisers of a job's processes (services/lcm/backends/local/processes.py), on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import wait_for
from trainforge_services.common import proctree
from trainforge_services.lcm.backends.local import processes

SLEEP = "import time; time.sleep(300)"


@pytest.fixture
def spawned():
    procs: list[subprocess.Popen] = []

    def spawn(argv: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, **kw)
        procs.append(proc)
        wait_for(lambda: proc.pid in proctree.table(), 10, "the process to show in /proc")
        return proc

    yield spawn
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_jobs_processes_are_found_by_spec_or_by_environment(tmp_path, spawned):
    job_dir = tmp_path / "work" / "job-1"
    (job_dir / "attempt-1" / "workdir").mkdir(parents=True)
    controller = spawned([sys.executable, "-c", SLEEP, "--spec", str(job_dir / "attempt-1" / "learner-0.json")])
    learner = spawned([sys.executable, "-c", SLEEP],
                      env={"TF_JOB_ID": "job-1", "TF_WORKDIR": str(job_dir / "attempt-1" / "workdir")})
    # the same id in another stack's state directory, and a spec of another job: not this job's
    spawned([sys.executable, "-c", SLEEP], env={"TF_JOB_ID": "job-1", "TF_WORKDIR": str(tmp_path / "other")})
    spawned([sys.executable, "-c", SLEEP, "--spec", str(tmp_path / "work" / "job-10" / "learner-0.json")])

    found = processes.job_processes(job_dir, "job-1")

    assert sorted(p.pid for p in found) == sorted([controller.pid, learner.pid])
    assert sorted(p.pid for p in processes.job_processes(job_dir, "job-1", proctree.table())) == \
        sorted([controller.pid, learner.pid])


def test_group_members_are_the_groups_processes_working_inside_the_folder(tmp_path, spawned):
    inside, outside = tmp_path / "attempt", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    # a group leader (its own session) with two members: one working beside it, one in another folder
    leader = spawned(["/bin/sh", "-c", f"sleep 300 & (cd {outside} && exec sleep 301) & wait"], cwd=inside,
                     start_new_session=True)

    def members() -> dict[str, int]:
        rows = proctree.table()
        return {os.readlink(f"/proc/{pid}/cwd"): pid for pid in proctree.descendants([leader.pid], rows)
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep")}

    found = wait_for(lambda: len(members()) == 2 and members(), 10, "the group's members to start")

    assert sorted(p.pid for p in processes.group_members(leader.pid, inside)) == \
        sorted([leader.pid, found[str(inside)]])
    assert [p.pid for p in processes.group_members(leader.pid, outside)] == [found[str(outside)]]
    assert processes.group_members(leader.pid + 1_000_000, inside) == []

"""The launcher's `down` on a stack of stand-in processes: order, escalation, and leaving others alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from tests.servers import wait_for
from trainforge_services.devstack import launcher
from trainforge_services.devstack.components import NAMES, Status
from trainforge_services.devstack.procs import stack_processes

STAND_IN = textwrap.dedent("""
    import pathlib, signal, sys, time
    name, journal, ready, polite = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    def bye(*_):
        with open(journal, "a") as f:
            f.write(name + "\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, bye if polite else signal.SIG_IGN)
    pathlib.Path(ready).touch()
    while True:
        time.sleep(1)
""")


@pytest.fixture
def fake_stack(tmp_path):
    state = tmp_path / "state"
    (state / "pids").mkdir(parents=True)
    stack_id = "stack-under-test"
    (state / "stack.json").write_text(json.dumps({"stack_id": stack_id, "ports": {}}))
    journal = tmp_path / "journal"
    procs: dict[str, subprocess.Popen] = {}

    def start(name, *, stack_id=stack_id, polite=True, pid_file=True):
        ready = tmp_path / f"{name}.ready"
        env = {**os.environ, "TF_STACK_ID": stack_id} if stack_id else {
            k: v for k, v in os.environ.items() if k != "TF_STACK_ID"}
        proc = subprocess.Popen([sys.executable, "-c", STAND_IN, name, str(journal), str(ready), "1" if polite else "0"],
                                env=env, start_new_session=True)
        procs[name] = proc
        wait_for(ready.exists, 10, f"{name} to be ready")
        if pid_file:
            (state / "pids" / f"{name}.pid").write_text(f"{proc.pid}\n")
        return proc

    yield state, stack_id, journal, start, procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_down_stops_services_then_learners_then_stores(fake_stack):
    state, stack_id, journal, start, procs = fake_stack
    for name in ("etcd", "mongo", "logstore", "trainer", "lcm", "api"):
        start(name)
    start("controller-0", pid_file=False)
    stubborn = start("learner-stubborn", polite=False, pid_file=False)
    reported = []
    statuses = launcher.down(state, report=reported.append, grace=0.5)
    assert statuses == reported
    # each name once, in the order first stopped: a component that leads its process group is signalled as the
    # group and as itself, so a slow stand-in may journal a second SIGTERM
    order = list(dict.fromkeys(journal.read_text().split()))
    assert order == ["api", "trainer", "lcm", "controller-0", "logstore", "mongo", "etcd"]
    by_pid = {s.pid: s for s in statuses}
    assert by_pid[stubborn.pid].status == Status.KILLED
    assert {s.name: s.status for s in statuses if s.name in NAMES} == dict.fromkeys(NAMES, Status.STOPPED)
    for proc in procs.values():
        proc.wait(5)
    assert not list((state / "pids").glob("*.pid"))
    assert not stack_processes(stack_id)


def test_down_leaves_recycled_pids_and_other_stacks_alone(fake_stack):
    state, stack_id, _, start, procs = fake_stack
    stranger = start("mongo", stack_id="", pid_file=True)  # a pid file whose pid now belongs to someone else
    neighbour = start("other-stack-learner", stack_id="another-stack", pid_file=False)
    statuses = launcher.down(state, grace=0.5)
    assert {s.name: s.status for s in statuses}["mongo"] == Status.NOT_RUNNING
    assert stranger.poll() is None and neighbour.poll() is None
    assert psutil.Process(stranger.pid).status() != psutil.STATUS_ZOMBIE
    assert not (state / "pids" / "mongo.pid").exists()
    stranger.send_signal(signal.SIGTERM)


def test_down_without_a_stack_is_a_no_op(tmp_path):
    assert launcher.down(tmp_path / "nothing-here") == []
    (tmp_path / "empty").mkdir()
    statuses = [s.status for s in launcher.down(tmp_path / "empty")]
    assert statuses and set(statuses) == {Status.NOT_RUNNING}, statuses

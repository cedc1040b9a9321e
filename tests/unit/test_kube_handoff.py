"""The learner pod's two halves without a cluster: the controller's hand-off and the learner container's waiter,
as real processes meeting in a shared directory (as the pod's emptyDir), started the way the pod starts them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainforge_frameworks import podwaiter as waiter
from trainforge_services.lcm.backends.kubernetes.entry import HANDOFF_MODULE
from trainforge_services.lcm.backends.kubernetes.pods import WAITER_MODULE

DEADLINE = 30.0


def until(what: str, check, deadline: float = DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def pod(tmp_path):
    """The hand-off directory and a working directory; the processes started are ended at the end."""
    # longer than a unix socket's path may be (107 bytes), as the test node's volume directories are
    share, work = tmp_path / ("handoff-" + "x" * 100), tmp_path / "work"
    share.mkdir()
    work.mkdir()
    procs: list[subprocess.Popen] = []

    def start(kind: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        module = WAITER_MODULE if kind == "waiter" else HANDOFF_MODULE
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=work, env=env or dict(os.environ),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        procs.append(proc)
        return proc

    yield share, work, start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=DEADLINE)


def learner(script: str) -> list[str]:
    return [sys.executable, "-c", script]


def test_the_learner_runs_in_the_waiters_container_with_only_the_controllers_env_and_reports_its_exit(pod):
    share, work, start = pod
    # the waiter's own env holds a credential (as a careless pod might): the learner must not see it
    w = start("waiter", str(share), env={**os.environ, "TF_S3_SECRET_KEY": "platform-secret"})
    script = ("import os, sys; print('hello from', os.getcwd()); print('oops', file=sys.stderr); "
              "print(sorted(k for k in os.environ if k.startswith('TF_') or k == 'ONLY')); sys.exit(3)")
    h = start("handoff", "--reason", str(work.parent / "reason"), str(share), *learner(script),
              env={"PATH": os.environ.get("PATH", ""), "ONLY": "1"})
    out, err = h.communicate(timeout=DEADLINE)
    assert h.returncode == 3
    lines = out.decode().splitlines()
    assert lines[0] == f"hello from {work}"
    assert lines[1] == "['ONLY']"  # the learner's env is the hand-off's, nothing of the waiter's
    assert "oops" in err.decode()
    assert w.wait(DEADLINE) == 3
    assert (share / waiter.EXIT).read_text().split() == ["3", "0"] and (share / waiter.END).exists()
    assert not (work.parent / "reason").exists()  # an exit code says it all: no reason of the hand-off's


def test_a_stop_reaches_the_learner_through_the_share_and_it_may_finish_its_checkpoint(pod):
    share, work, start = pod
    w = start("waiter", str(share))
    script = ("import signal, sys, time, pathlib\n"
              "def bye(*_):\n"
              "    time.sleep(0.5); pathlib.Path('ckpt').write_text('saved'); print('saved', flush=True); sys.exit(7)\n"
              "signal.signal(signal.SIGTERM, bye)\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    # through a shell, as the controller runs every command: the shell dies of the SIGTERM at once
    h = start("handoff", str(share), "/bin/sh", "-c", f"{sys.executable} -c \"$0\"", script)
    until("the learner to run", lambda: b"ready" in (share / waiter.STDOUT).read_bytes()
          if (share / waiter.STDOUT).exists() else False)
    os.kill(h.pid, signal.SIGTERM)  # what the controller's halt sends its learner's group
    out, _ = h.communicate(timeout=DEADLINE)
    assert b"saved" in out and (work / "ckpt").read_text() == "saved"
    assert h.returncode == -signal.SIGTERM  # the shell died of it: the hand-off dies of it too
    assert w.wait(DEADLINE) == 128 + signal.SIGTERM


def test_the_controllers_sigkill_after_the_grace_kills_the_learner_too(pod):
    share, _work, start = pod
    w = start("waiter", str(share))
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
             "time.sleep(120)"
    h = start("handoff", str(share), *learner(script))
    until("the learner to run", lambda: (share / waiter.STDOUT).exists()
          and b"ready" in (share / waiter.STDOUT).read_bytes())
    os.kill(h.pid, signal.SIGTERM)
    time.sleep(0.3)  # the learner ignores it, as one that outlives its grace does
    assert w.poll() is None
    os.kill(h.pid, signal.SIGKILL)  # the controller's SIGKILL to its learner's group after the grace
    assert w.wait(DEADLINE) == 128 + signal.SIGKILL
    assert (share / waiter.EXIT).read_text().split() == [str(128 + signal.SIGKILL), str(int(signal.SIGKILL))]


def test_a_waiter_whose_controller_ended_without_a_go_exits_without_starting_anything(pod):
    share, _work, start = pod
    w = start("waiter", str(share))
    until("the waiter to listen", lambda: (share / waiter.SOCKET).exists())
    (share / waiter.CONTROLLER_END).write_text("")
    assert w.wait(DEADLINE) == 0
    assert not (share / waiter.STDOUT).exists() and not (share / waiter.SOCKET).exists()


def test_a_hand_off_stopped_before_the_learner_container_listens_starts_nothing(pod):
    share, _work, start = pod
    h = start("handoff", str(share), *learner("print('never')"))
    time.sleep(0.2)
    os.kill(h.pid, signal.SIGTERM)
    assert h.wait(DEADLINE) == -signal.SIGTERM
    assert not (share / waiter.STDOUT).exists()


def test_a_learner_container_that_ends_without_reporting_is_a_reasoned_failure(pod):
    share, work, start = pod
    w = start("waiter", str(share))
    h = start("handoff", "--reason", str(work.parent / "reason"), str(share),
              *learner("import time; print('ready', flush=True); time.sleep(120)"))
    until("the learner to run", lambda: (share / waiter.STDOUT).exists()
          and b"ready" in (share / waiter.STDOUT).read_bytes())
    os.killpg(w.pid, signal.SIGKILL)  # the learner container is gone (the waiter killed with it)
    assert h.wait(DEADLINE) == 255
    assert "ended without reporting how the learner ended" in (work.parent / "reason").read_text()


def test_the_waiter_and_hand_off_name_their_usage():
    assert waiter.main(["waiter"]) == waiter.EXIT_USAGE
    proc = subprocess.run([sys.executable, "-m", HANDOFF_MODULE, "dir-only"], capture_output=True, text=True,
                          timeout=DEADLINE)
    assert proc.returncode == 2 and "usage" in proc.stderr
    assert Path(waiter.__file__).read_text().count("import trainforge") == 0  # the waiter is standard library only

"""trainforge_services.common.proctree: SIGTERM, grace, SIGKILL, over whole process trees and groups."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.servers import wait_for
from trainforge_services.common import proctree

# argv: ready-file, polite ("1": exit on SIGTERM, "0": ignore it), then what to start:
# "child" (a child ignoring SIGTERM, its pid written to ready-file.child) or "helper" (a
# double-forked helper that stays in our process group but is nobody's descendant).
SCRIPT = textwrap.dedent("""
    import os, pathlib, signal, subprocess, sys, time
    ready, polite, extra = pathlib.Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
    signal.signal(signal.SIGTERM, (lambda *_: sys.exit(0)) if polite else signal.SIG_IGN)
    if extra == "child":
        child = subprocess.Popen([sys.executable, "-c", sys.argv[4], str(ready) + ".child", "0", "none", ""])
    elif extra == "helper":
        if os.fork() == 0:
            if os.fork() == 0:
                signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
                pathlib.Path(str(ready) + ".helper").write_text(str(os.getpid()))
                while True:
                    time.sleep(1)
            os._exit(0)
        os.wait()
    ready.touch()
    while True:
        time.sleep(1)
""")


def _start(tmp_path: Path, name: str, *, polite: bool, extra: str = "none", session: bool = False
           ) -> tuple[subprocess.Popen, Path]:
    ready = tmp_path / f"{name}.ready"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(ready), "1" if polite else "0", extra, SCRIPT],
                            start_new_session=session)
    wait_for(ready.exists, 20, f"{name} to be ready")
    return proc, ready


def _pid_when_written(path: Path) -> int:
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), 20, f"{path.name} to be written"))


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def started():
    procs: list[subprocess.Popen] = []
    extra_pids: list[int] = []
    yield procs, extra_pids
    for pid in extra_pids:
        if _running(pid):
            os.kill(pid, 9)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, started):
    procs, extra = started
    parent, ready = _start(tmp_path, "parent", polite=True, extra="child")
    procs.append(parent)
    child_ready = Path(str(ready) + ".child")
    wait_for(child_ready.exists, 20, "the stubborn child to be ready")
    (child,) = psutil.Process(parent.pid).children()
    extra.append(child.pid)

    stopped = proctree.terminate([psutil.Process(parent.pid)], grace=0.5)

    assert stopped.terminated == [parent.pid]
    assert stopped.killed == [child.pid] and not stopped.survivors
    assert not _running(child.pid) and not _running(parent.pid)


def test_a_group_leaders_helpers_go_too(tmp_path, started):
    procs, extra = started
    leader, ready = _start(tmp_path, "leader", polite=True, extra="helper", session=True)
    procs.append(leader)
    helper = _pid_when_written(Path(str(ready) + ".helper"))
    extra.append(helper)
    assert helper not in proctree.with_descendants([psutil.Process(leader.pid)])  # only the group finds it
    assert proctree.leads_group(leader.pid)

    stopped = proctree.terminate([psutil.Process(leader.pid)], grace=5)

    assert stopped.terminated == [leader.pid]
    wait_for(lambda: not _running(helper), 10, "the helper to exit")


def test_our_own_children_are_reaped(tmp_path, started):
    procs, _ = started
    child, _ = _start(tmp_path, "child", polite=True)
    procs.append(child)

    stopped = proctree.terminate([psutil.Process(child.pid)], grace=5)

    assert stopped.terminated == [child.pid]
    # reaped by terminate itself: no zombie is left for us to collect
    assert not _running(child.pid)
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)


def test_stopped_names_which_pids_were_terminated_and_which_killed(tmp_path, started):
    procs, _ = started
    polite, _ = _start(tmp_path, "polite", polite=True)
    stubborn, _ = _start(tmp_path, "stubborn", polite=False)
    procs += [polite, stubborn]

    stopped = proctree.terminate([psutil.Process(polite.pid), psutil.Process(stubborn.pid)], grace=0.5)

    assert stopped == proctree.Stopped(terminated=[polite.pid], killed=[stubborn.pid], survivors=[])
    assert stopped.count == 2


def test_nothing_alive_is_nothing_to_stop(tmp_path, started):
    procs, _ = started
    child, _ = _start(tmp_path, "short", polite=True)
    procs.append(child)
    target = psutil.Process(child.pid)
    child.terminate()
    child.wait(10)
    assert proctree.gone(target)
    assert proctree.terminate([target], grace=1) == proctree.Stopped()


def test_the_table_has_every_process_with_its_parent_group_and_zombie_state(tmp_path, started):
    procs, extra = started
    # a command name with a space and a parenthesis: the stat line is split after the name's last ")"
    odd_name = tmp_path / "x) (y"
    odd_name.symlink_to("/bin/sleep")
    odd = subprocess.Popen([str(odd_name), "300"], start_new_session=True)
    procs.append(odd)
    assert wait_for(lambda: psutil.Process(odd.pid).name() == "x) (y", 20, "the odd name to show")
    parent, ready = _start(tmp_path, "parent", polite=True, extra="child")
    procs.append(parent)
    wait_for(Path(str(ready) + ".child").exists, 20, "the child to be ready")
    (child,) = psutil.Process(parent.pid).children()
    extra.append(child.pid)
    short = subprocess.Popen([sys.executable, "-c", "pass"])
    procs.append(short)
    wait_for(lambda: psutil.Process(short.pid).status() == psutil.STATUS_ZOMBIE, 20, "a zombie child")

    rows = proctree.table()

    assert rows[os.getpid()] == proctree.Row(ppid=os.getppid(), pgid=os.getpgid(0), zombie=False)
    assert rows[child.pid].ppid == parent.pid and rows[child.pid].pgid == os.getpgid(parent.pid)
    assert rows[odd.pid] == proctree.Row(ppid=os.getpid(), pgid=odd.pid, zombie=False)
    assert rows[short.pid].zombie
    assert proctree.descendants([parent.pid], rows) == {child.pid}
    assert child.pid in proctree.descendants([os.getpid()], rows)
    assert set(proctree.with_descendants([psutil.Process(parent.pid)], rows)) == {parent.pid, child.pid}
    assert proctree.process(short.pid) is not None  # a zombie is still a process until reaped
    short.wait()
    assert proctree.process(short.pid) is None

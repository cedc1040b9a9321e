"""Python learners under a real controller, with and without the sandbox: one write(2) per printed line
(services/controller/pyhook/sitecustomize.py), every line archived in order, none lost to a SIGKILL."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_controller_run import controller_log, launch, pack, status  # noqa: F401 - fixture
from trainforge_services.common.adapters.objectstore import store_from_settings
from trainforge_services.common.states import LearnerState

pytestmark = pytest.mark.slow

LINES = 3000
# Counts its own write(2) calls (/proc/self/io's syscw) around the loop, says how many on stderr, then dies
# by SIGKILL: no exit handler flushes anything, so what is archived is what reached the pipe at print time.
FLOOD = f"""\
import os, signal, sys


def syscw():
    with open("/proc/self/io") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("syscw:"))


before = syscw()
for i in range({LINES}):
    print(f"line {{i:05d}}")
    if i % 500 == 0:
        print(f"err {{i}}", file=sys.stderr)
after = syscw()
print(f"writes {{after - before}}", file=sys.stderr)
os.kill(os.getpid(), signal.SIGKILL)
"""

# stdout and stderr alternately, well apart in time: the archive keeps their order.
ALTERNATE = """\
import sys, time
for i in range(4):
    print(f"out {i}")
    time.sleep(0.15)
    print(f"err {i}", file=sys.stderr)
    time.sleep(0.15)
"""

USER_SITE = """\
import os
os.environ["USER_SITECUSTOMIZE"] = "ran"
"""

CHECK_SITE = """\
import os, sys
print("user", os.environ.get("USER_SITECUSTOMIZE"))
print("line_buffering", sys.stdout.line_buffering, sys.stdout.write_through)
print("hook on sys.path", any(p.endswith("pyhook") for p in sys.path))
"""


def archive_of(store_settings, run) -> list[dict]:
    raw = store_from_settings(store_settings).get_bytes(f"jobs/{run.job}/logs/0-1.jsonl")
    # the learner's own lines (with isolation "none" the controller adds a line of its own about it)
    return [d for d in map(json.loads, raw.splitlines()) if d["stream"] in ("stdout", "stderr")]


@pytest.mark.parametrize("isolation", ["none", "sandbox"])
def test_each_printed_line_is_one_write_and_a_sigkill_loses_none(launch, coordinator, store_settings,  # noqa: F811
                                                                  isolation):
    run = launch({"command": "exec python flood.py"}, code=pack({"flood.py": FLOOD}), isolation=isolation)
    assert run.wait(120) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED and doc["exit_code"] == 137, doc
    assert doc["isolation"] == isolation, doc
    docs = archive_of(store_settings, run)
    out = [d["line"] for d in docs if d["stream"] == "stdout"]
    err = [d["line"] for d in docs if d["stream"] == "stderr"]
    assert out == [f"line {i:05d}" for i in range(LINES)]
    assert err == [*(f"err {i}" for i in range(0, LINES, 500)), f"writes {LINES + LINES // 500}"], err
    seqs = [d["seq"] for d in docs]
    assert len(set(seqs)) == len(seqs)


@pytest.mark.parametrize("isolation", ["none", "sandbox"])
def test_stdout_and_stderr_lines_keep_their_order_in_time(launch, coordinator, store_settings,  # noqa: F811
                                                          isolation):
    run = launch({"command": "python alternate.py"}, code=pack({"alternate.py": ALTERNATE}), isolation=isolation)
    assert run.wait(60) == 0, controller_log(run)
    assert status(coordinator, run)["state"] == LearnerState.LEARNER_COMPLETED
    docs = sorted(archive_of(store_settings, run), key=lambda d: d["seq"])
    assert [(d["stream"], d["line"]) for d in docs] == [
        pair for i in range(4) for pair in (("stdout", f"out {i}"), ("stderr", f"err {i}"))]


@pytest.mark.parametrize("isolation", ["none", "sandbox"])
def test_a_users_own_sitecustomize_runs_beside_the_hook(launch, coordinator, store_settings, isolation):  # noqa: F811
    code = pack({"check.py": CHECK_SITE, "site/sitecustomize.py": USER_SITE})
    run = launch({"command": "python check.py", "env": {"PYTHONPATH": "site"}}, code=code, isolation=isolation)
    assert run.wait(60) == 0, controller_log(run)
    assert status(coordinator, run)["state"] == LearnerState.LEARNER_COMPLETED
    assert [d["line"] for d in archive_of(store_settings, run)] == [
        "user ran", "line_buffering True False", "hook on sys.path False"]


def test_a_manifest_setting_pythonunbuffered_keeps_write_through(launch, coordinator, store_settings):  # noqa: F811
    run = launch({"command": "python check.py", "env": {"PYTHONUNBUFFERED": "1"}},
                 code=pack({"check.py": CHECK_SITE}), isolation="none")
    assert run.wait(60) == 0, controller_log(run)
    assert [d["line"] for d in archive_of(store_settings, run)] == [
        "user None", "line_buffering False True", "hook on sys.path False"]

"""common/niceness.py on real processes: the nice value and the session's autogroup, lowered and never raised."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from trainforge_services.common import niceness

AUTOGROUP = Path("/proc/self/autogroup").exists()


def run_in_own_session(code: str) -> str:
    """Output of `code` run by a fresh interpreter leading its own session (a new autogroup at nice 0)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         start_new_session=True, check=True)
    return out.stdout.strip()


LOWER_SELF = (
    "import os; from trainforge_services.common import niceness as n; "
    "before = (os.getpriority(os.PRIO_PROCESS, 0), n.autogroup_nice()); "
    "problems = n.lower({nice}); "
    "print(before, (os.getpriority(os.PRIO_PROCESS, 0), n.autogroup_nice()), problems)"
)


def test_a_process_lowers_itself_and_its_sessions_autogroup():
    out = run_in_own_session(LOWER_SELF.format(nice=7))
    group = "7" if AUTOGROUP else "None"
    group_before = "0" if AUTOGROUP else "None"
    assert out == f"(0, {group_before}) (7, {group}) []"


def test_zero_changes_nothing():
    out = run_in_own_session(LOWER_SELF.format(nice=0))
    group = "0" if AUTOGROUP else "None"
    assert out == f"(0, {group}) (0, {group}) []"


def test_a_process_already_lower_is_not_raised():
    # started at nice 12: asking for 5 leaves the process at 12 (only the autogroup, at 0, is lowered to 5)
    out = run_in_own_session("import os; os.nice(12); " + LOWER_SELF.format(nice=5))
    assert out.startswith("(12, ") and out.split(") (")[1].startswith("12, ")
    assert out.endswith("[]")


def test_another_process_is_lowered_by_pid():
    # what a controller does for its learner: the learner leads a session of its own
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        assert niceness.lower(9, sleeper.pid) == []
        assert psutil.Process(sleeper.pid).nice() == 9
        assert niceness.autogroup_nice(sleeper.pid) == (9 if AUTOGROUP else None)
        # the caller is untouched
        assert os.getpriority(os.PRIO_PROCESS, 0) == own
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_that_is_gone_is_named_not_raised():
    gone = subprocess.Popen(["true"])
    gone.wait()
    problems = niceness.lower(5, gone.pid)
    assert problems and all(str(gone.pid) in p for p in problems), problems


@pytest.mark.parametrize("bad", [-1, 20])
def test_a_nice_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="0..19"):
        niceness.lower(bad)

"""The learners' line-buffering hook inside both sandboxes (as root: `sandbox`; controllers as uid 65534:
`userns`): its folder is in the filesystem view and readable there, and a printed line is one write(2)."""

from __future__ import annotations

import pytest

from tests.integration.sandbox_jobs import (  # noqa: F401 - fixtures
    nobody_python,
    own_userns_platform,
    platform,
    root_platform,
    unprivileged_platform,
)
from trainforge_services.common.states import LearnerState

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = """\
import sys


def syscw():
    with open("/proc/self/io") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("syscw:"))


before = syscw()
for i in range(100):
    print(f"line {i}")
writes = syscw() - before
print("writes", writes)
print("streams", sys.stdout.line_buffering, sys.stdout.write_through, sys.stderr.line_buffering)
"""


def test_a_sandboxed_python_learner_writes_each_printed_line_once(platform, unique):  # noqa: F811
    job = f"j-{unique}"
    doc = platform.run(job, SCRIPT)
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, platform.log(job)
    assert doc["isolation"] == platform.isolation, doc
    assert doc["tail"][-2:] == ["writes 100", "streams True False True"], doc["tail"]

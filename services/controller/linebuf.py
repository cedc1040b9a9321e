"""Line-buffered output for Python learners (the start-up hook in services/controller/pyhook/).

The learner runs with PYTHONUNBUFFERED=1 so its logs follow live; that makes
CPython's text streams write-through, two write(2) calls per `print(line)`.
The hook, first on the learner's PYTHONPATH, turns a pipe-connected
stdout/stderr line-buffered instead: one write(2) per line, and each line in
the pipe as soon as it is printed. A manifest that sets PYTHONUNBUFFERED
itself (`"1"`: write-through as before, `""`: buffered) chooses its own
buffering and does not get the hook; neither does `python -u`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# The folder holds nothing but the hook's sitecustomize.py: it is what a learner's import path gets.
HOOK_DIR = Path(__file__).resolve().with_name("pyhook")
SWITCH = "PYTHONUNBUFFERED"


def with_hook(env: dict[str, str], chosen: Mapping[str, str]) -> dict[str, str]:
    """env (a learner's) with the hook's folder first on PYTHONPATH, unless `chosen` (the variables the
    job's manifest set) names PYTHONUNBUFFERED. A folder missing where the learner runs (a container's
    image) is skipped by Python without a word."""
    if SWITCH in chosen:
        return env
    rest = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), rest]) if rest else str(HOOK_DIR)
    return env

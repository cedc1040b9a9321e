"""Shared pieces of the bench scripts: the machine line, percentiles, a private embedded stack.

Every script starts its own stack (`trainforge up` in a temporary state dir) so
what it measures is the code in this tree, and stops it (`trainforge down`)
whatever happens. The state dir is removed after a run that ended well; one
that raised, or any with TF_BENCH_KEEP=1, keeps it and says where. `extra_env` lets a script lift the API's rate limit or give
the local backend more room; the stack's services read those TF_* variables.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the scripts share the test suite's helpers (tests/servers.py)
TERMINAL = ("completed", "failed", "cancelled")


def bench_python() -> Path:
    """The bench venv's interpreter (`make bench-venv`): `$BENCH_VENV/bin/python`, else the one
    tools/benchvenv/setup.sh makes in the per-user cache (tests/toolcache.py)."""
    from tests import toolcache

    return toolcache.where("bench-venv") / "bin" / "python"


def machine_line() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"machine: {platform.machine()}, {psutil.cpu_count()} cores, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}, "
            f"load average {load}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


# The Trainer's timing line for a pass with a queue (services/trainer/dispatcher.py `run_once`)
_PASS = re.compile(r"admission pass: (\d+) queued, (\d+) dispatched in (\d+(?:\.\d+)?) ms"
                   r"(?: \(decided in (\d+(?:\.\d+)?) ms\))?")


def admission_passes(log_text: str) -> list[tuple[int, int, float, float]]:
    """(queued, dispatched, ms, decided ms) of every admission pass the Trainer's log text records."""
    return [(int(q), int(d), float(ms), float(dec or ms)) for q, d, ms, dec in _PASS.findall(log_text)]


# The writer thread's line for one pass's reservations (services/trainer/dispatcher.py `_write`)
_WRITES = re.compile(r"admission writes: (\d+) reservations written in (\d+(?:\.\d+)?) ms, "
                     r"(\d+(?:\.\d+)?) ms after their pass decided")


def reservation_writes(log_text: str) -> list[tuple[int, float, float]]:
    """(reservations, ms writing them, ms from the pass's decision to the last written) of each pass's batch."""
    return [(int(n), float(ms), float(after)) for n, ms, after in _WRITES.findall(log_text)]


def spread(values: list[float]) -> str:
    """median (min-max) of a list, for alternating rounds."""
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env.update(extra or {})
    return env


def cli(env: dict, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "trainforge.cli", *args], env=env, check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, timeout=300)


@dataclass(frozen=True)
class Stack:
    state: Path
    config: dict

    @property
    def api_url(self) -> str:
        return self.config["api_url"]

    @property
    def api_key(self) -> str:
        return self.config["api_key"]

    def status(self) -> dict:
        return json.loads((self.state / "stack.json").read_text())

    def log(self, component: str) -> Path:
        return self.state / "logs" / f"{component}.log"


@contextlib.contextmanager
def stack(extra_env: dict[str, str] | None = None) -> Iterator[Stack]:
    state = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    env = clean_env(extra_env)
    env["TF_STATE_DIR"] = str(state)
    cli(env, "up")
    ok = False
    try:
        yield Stack(state, json.loads((state / "config.json").read_text()))
        ok = True
    finally:
        cli(env, "down")
        # a run that went wrong keeps its state (logs, archives) for a look; so does any run with TF_BENCH_KEEP=1
        if ok and not os.environ.get("TF_BENCH_KEEP"):
            shutil.rmtree(state, ignore_errors=True)
        else:
            print(f"stack state kept in {state}", file=sys.stderr)


def platform_procs(state: Path) -> dict[str, list[psutil.Process]]:
    """The stack's monitors, controllers and guards by job (their spec or working directory is under
    `<state>/work/<job>/`)."""
    work = str(state / "work") + "/"
    found: dict[str, list[psutil.Process]] = {}
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmd = p.info["cmdline"] or []
        if not any(part.startswith(("trainforge_services.controller", "trainforge_services.jobmonitor")) for part in cmd):
            continue
        where = next((part for part in cmd if part.startswith(work)), p.info["cwd"] or "")
        if where.startswith(work):
            found.setdefault(where[len(work):].split("/")[0], []).append(p)
    return found


def pids(state: Path, *names: str) -> list[int]:
    """The pids of the stack's components (`<state>/pids/<name>.pid`)."""
    return [int((state / "pids" / f"{n}.pid").read_text().split()[0]) for n in names]

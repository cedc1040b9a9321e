"""The embedded stack's state directory and its processes.

`<state>/stack.json` records the stack's id and ports, `<state>/pids/<name>.pid`
and `<state>/logs/<name>.log` each component's pid and output, and
`<state>/stack.lock` keeps `up` and `down` from running at once. A process
belongs to a stack when TF_STACK_ID=<its id> is in its environment: the
components get it from us and pass it on to whatever they start
(controllers, monitors, learners), so a recycled pid is never mistaken for
one of ours and `down` finds orphans too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from trainforge_services.common import proctree

STACK_FILE = "stack.json"
CONFIG_FILE = "config.json"
# Signals a spawned process gets back at their defaults (a CLI run with `&` or nohup ignores
# some of them, and ignored signals survive exec).
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP)


def pid_file(state: Path, name: str) -> Path:
    return state / "pids" / f"{name}.pid"


def log_file(state: Path, name: str) -> Path:
    return state / "logs" / f"{name}.log"


def read_meta(state: Path) -> dict:
    try:
        data = json.loads((Path(state) / STACK_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_meta(state: Path, meta: dict) -> None:
    tmp = state / (STACK_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, state / STACK_FILE)


def read_pid(state: Path, name: str) -> int | None:
    try:
        return int(pid_file(state, name).read_text().strip())
    except (OSError, ValueError):
        return None


def update_config(state: Path, **values: str) -> dict:
    """Set `values` in the CLI's config.json (owner-only: it holds a key), keeping every other entry."""
    path = state / CONFIG_FILE
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        cfg = {}
    cfg = {**(cfg if isinstance(cfg, dict) else {}), **values}
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return cfg


def read_config(state: Path) -> dict:
    try:
        cfg = json.loads((state / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


@contextlib.contextmanager
def locked(state: Path) -> Iterator[None]:
    """One `up` or `down` at a time per state directory."""
    with open(state / "stack.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return " | ".join(ln.strip() for ln in tail)


# -- processes --------------------------------------------------------------------------------


def belongs(proc: psutil.Process, stack_id: str) -> bool:
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return proc.environ().get("TF_STACK_ID") == stack_id
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def alive_pid(pid: int | None, stack_id: str) -> int | None:
    """pid when it is a live process of this stack (not a recycled pid)."""
    if not pid or not stack_id:
        return None
    proctree.reap(pid)
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
    return pid if belongs(proc, stack_id) else None


def stack_processes(stack_id: str, exclude: set[int] | frozenset[int] = frozenset()) -> list[psutil.Process]:
    """Every live process whose environment carries TF_STACK_ID=stack_id (never us or our parents)."""
    me = psutil.Process()
    skip = set(exclude) | {me.pid} | {p.pid for p in me.parents()}
    return [p for p in psutil.process_iter(["pid"]) if p.pid not in skip and belongs(p, stack_id)]


def describe(proc: psutil.Process) -> str:
    """A name for a process found by its stack id: the service module it runs, else `learner`."""
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "process"
    for i, arg in enumerate(cmd[:-1]):
        if arg == "-m" and cmd[i + 1].startswith("trainforge_services."):
            return cmd[i + 1].removeprefix("trainforge_services.")
    return "learner" if cmd else "process"


def spawn(argv: list[str], env: dict[str, str], log_path: Path) -> int:
    """Start argv in a new session, stdout and stderr appended to log_path; return its pid.

    posix_spawn rather than subprocess.Popen: the process outlives us by
    design and nobody will ever wait on a Popen object for it.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        return os.posix_spawn(argv[0], argv, env, setsid=True, setsigdef=_DEFAULT_SIGNALS, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, fd, 1),
            (os.POSIX_SPAWN_DUP2, fd, 2),
        ])
    finally:
        os.close(fd)

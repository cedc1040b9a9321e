"""Processes on this machine: how the local backend starts, recognises and stops them.

Controllers and job monitors are started in their own sessions (so they
outlive the LCM), by `spawn` here or forked by the warm fork server
(`forkclient.py`, same command line), with the LCM's TF_* settings spelled
out in their environment; they run the LCM's interpreter, which imports the
platform's packages from its installation. A recorded process is ours only
while its pid *and* start time match, so a reused pid is never mistaken for
it. Stopping goes through `trainforge_services.common.proctree`.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path

import psutil

from trainforge_services.common import proctree
from trainforge_services.common.settings import LcmSettings, StoreSettings


def detect_gpus() -> int:
    """How many GPUs `nvidia-smi -L` lists; 0 without nvidia-smi or when it fails."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def child_env(settings: LcmSettings) -> dict[str, str]:
    """The environment of controllers and monitors: ours, with the LCM's settings spelled out."""
    env = dict(os.environ)
    for name in StoreSettings.model_fields:
        env[f"TF_{name.upper()}"] = _env_value(getattr(settings, name))
    env["TF_LEASE_TTL"] = str(settings.lease_ttl)  # the monitors' claim; controllers get it in their spec
    env["TF_JOB_NICE"] = str(settings.job_nice)  # they lower themselves and their learners (common/niceness.py)
    return env


def spawn(argv: list[str], cwd: Path, log_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen, float]:
    """Start argv in its own session, output appended to log_path; the Popen and its start time.

    OSError when it cannot start.
    """
    with open(log_path, "ab") as out:
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 cwd=cwd, env=env, start_new_session=True)
    try:
        started = psutil.Process(popen.pid).create_time()
    except psutil.Error:
        started = 0.0  # already gone; the record still names it for the logs
    return popen, started


def running(pid: int, started: float) -> psutil.Process | None:
    """The process if it still runs (same pid *and* start time, not a zombie)."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started) > 1.0:
            return None
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except psutil.Error:
        return None


def _inside(path: str | None, root: Path) -> bool:
    return bool(path) and Path(path).is_relative_to(root)


def _read(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _names_a_spec_inside(cmdline: bytes, job_dir: Path) -> bool:
    argv = [a.decode(errors="replace") for a in cmdline.split(b"\0")]
    return any(a == "--spec" and _inside(b, job_dir) for a, b in zip(argv, argv[1:], strict=False))


def _carries_job(environ: bytes, job_id: str, job_dir: Path) -> bool:
    if f"TF_JOB_ID={job_id}".encode() not in environ:  # cheap test first: most processes are not the job's
        return False
    env = dict(item.decode(errors="replace").partition("=")[::2] for item in environ.split(b"\0") if b"=" in item)
    return env.get("TF_JOB_ID") == job_id and _inside(env.get("TF_WORKDIR"), job_dir)


def job_processes(job_dir: Path, job_id: str, rows: proctree.Table | None = None) -> list[psutil.Process]:
    """Every running process of one job, recorded or not (among `rows`, or a fresh `proctree.table()`).

    Controllers and monitors run a spec file inside the job's directory;
    learners (and whatever they start) carry the controller's TF_JOB_ID and a
    TF_WORKDIR inside it. Both tests name a file of this LCM's state
    directory, so another stack's job of the same id is never touched. The
    command line and environment are read raw from /proc (one read each; a
    process that cannot be read is not ours: ours run as this user).
    """
    me = os.getpid()
    out = []
    for pid, row in (proctree.table() if rows is None else rows).items():
        if pid == me or row.zombie:
            continue
        if _names_a_spec_inside(_read(pid, "cmdline"), job_dir) or _carries_job(_read(pid, "environ"), job_id, job_dir):
            proc = proctree.process(pid)
            if proc is not None:
                out.append(proc)
    return out


def group_members(pgid: int, under: Path, rows: proctree.Table | None = None) -> list[psutil.Process]:
    """Running processes of group `pgid` working inside `under` (among `rows`, or a fresh `proctree.table()`).

    The directory check keeps a recycled pid's unrelated process group safe
    when the recorded leader is gone: ours all run in the attempt directory.
    """
    out = []
    for pid, row in (proctree.table() if rows is None else rows).items():
        if row.pgid != pgid or row.zombie:
            continue
        try:
            if not Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(under):
                continue
        except OSError:
            continue
        proc = proctree.process(pid)
        if proc is not None:
            out.append(proc)
    return out


def stop_groups(leaders: Iterable[tuple[int, psutil.Process | None]], under: Path, *, grace: float,
                extra: Iterable[psutil.Process] = (), rows: proctree.Table | None = None) -> proctree.Stopped:
    """Stop recorded group leaders (pid, process-or-None when gone) with their groups, plus `extra`.

    A leader that is gone still has its group stopped when members of it work
    inside `under` (a controller SIGKILLed leaves its learner's shell behind).
    `rows`: a `proctree.table()` the caller just took; one is taken here otherwise.
    """
    rows = proctree.table() if rows is None else rows
    targets: dict[int, psutil.Process] = {p.pid: p for p in extra}
    groups: list[int] = []
    for pid, leader in leaders:
        members = ([leader] if leader else []) + group_members(pid, under, rows)
        if not members:
            continue  # gone, or the pid now belongs to someone else
        groups.append(pid)
        targets.update({p.pid: p for p in members})
    if not targets:
        return proctree.Stopped()
    return proctree.terminate(targets.values(), grace=grace, groups=groups, rows=rows)

"""The kernel resources a sandboxed learner uses on this machine, named once for the controller and the LCM.

A sandboxed job (services/controller/sandbox/) has one network namespace,
`tf-<job>`, that all its learners join, and one cgroup folder per learner
under `<controller root>/trainforge/<job>/` for each of the memory, cpu and
pids controllers. The controller creates them; the controller removes its
own cgroups when its learner is gone, and the local backend's `stop`
removes whatever is left of a job (`remove_job`), so a controller killed
with SIGKILL leaks nothing.

Without root the sandbox is built in user namespaces (`isolation: userns`,
services/controller/sandbox/userns.py): a per-job holder process owns the
job's user and network namespaces, in the job's folder; the local backend's
stop ends it with the job's other processes.

Only names and removal live here: both the controller and the LCM need
them and services share only `services/common/`.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("memory", "cpu", "pids")
CGROUP_PARENT = "trainforge"
NETNS_DIR = Path("/run/netns")
# One lock file per job namespace, so two ranks never race to create it.
NETNS_LOCKS = Path("/run/trainforge/netns-locks")


class Isolation(enum.StrEnum):
    """What a learner got, as its status reports it."""

    SANDBOX = "sandbox"
    USERNS = "userns"  # the sandbox without root: user namespaces, no cgroups
    NONE = "none"


# What a learner without a sandbox can do, said wherever it runs so (`trainforge up`, the job's status)
NOT_ISOLATED = ("NOT isolated: the learner runs as the platform's user without a sandbox and can read the "
                "platform's credentials and files, reach its servers and signal its processes")

UID_BASE, UID_SPAN = 1_000_000_000, 1_000_000_000


def job_uid(job_id: str) -> int:
    """An unprivileged uid (and gid) for the job's learners, far above any account's: the local sandbox's and the
    docker backend's containers' user, so the learners of one job share it and two jobs almost surely do not."""
    return UID_BASE + int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big") % UID_SPAN


def netns_name(job_id: str) -> str:
    return f"tf-{job_id}"


def job_cgroups(job_id: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """The job's cgroup folder in each controller's hierarchy."""
    return [root / c / CGROUP_PARENT / job_id for c in CGROUP_CONTROLLERS]


def _subfolders(path: Path, tries: int = 3) -> list[Path]:
    """Every folder under path, deepest first. A folder removed while it is listed (by the job's own controller
    or LCM at the same time: `trainforge down` met that) makes the listing start again, not fail."""
    for _ in range(tries):
        try:
            return sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        except FileNotFoundError:
            continue
    return []  # still changing: the rmdir of path says whether anything is left


def _rmdir_tree(path: Path) -> bool:
    """rmdir a cgroup folder and its children, deepest first; False when one still holds a process."""
    if not path.is_dir():
        return True
    ok = True
    for sub in _subfolders(path):
        try:
            sub.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove cgroup %s: %s", sub, e.strerror)
            ok = False
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove cgroup %s: %s", path, e.strerror)
        ok = False
    return ok


def _holds_tasks(path: Path) -> bool:
    try:
        return any(t.read_text().strip() for t in path.rglob("tasks"))
    except OSError:
        return False


def remove_cgroups(paths: list[Path], timeout: float = 5.0) -> bool:
    """Remove the folders once the processes the kernel is still killing have left them."""
    deadline = time.monotonic() + timeout
    while any(_holds_tasks(p) for p in paths if p.is_dir()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return all([_rmdir_tree(p) for p in paths])


def _unmount_netns(path: Path) -> None:
    """`ip netns delete` in-process: detach the namespace's bind mount and remove its file; OSError if either fails
    (a file never mounted is removed too)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), 2) != 0:  # MNT_DETACH
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # EINVAL: not a mount point (any more)
            raise OSError(err, f"umount {path}: {os.strerror(err)}")
    path.unlink(missing_ok=True)


def remove_netns(job_id: str) -> bool:
    """`ip netns delete tf-<job>` (in-process, `ip` where that fails); True when it is gone (or never was)."""
    (NETNS_LOCKS / netns_name(job_id)).unlink(missing_ok=True)
    path = NETNS_DIR / netns_name(job_id)
    if not path.exists():
        return True
    try:
        _unmount_netns(path)
        return True
    except OSError as e:
        inproc = e
    try:
        out = subprocess.run(["ip", "netns", "delete", netns_name(job_id)], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("cannot delete network namespace %s: in-process: %s; with ip: %s", netns_name(job_id), inproc, e)
        return False
    if out.returncode != 0 and path.exists():
        log.warning("cannot delete network namespace %s: in-process: %s; with ip: %s", netns_name(job_id), inproc,
                    out.stderr.strip())
        return False
    return True


def remove_job(job_id: str) -> bool:
    """Remove the job's network namespace and cgroups (after its processes are gone); True when clean."""
    if os.geteuid() != 0:
        return True  # nothing of this was ever made without root
    return remove_cgroups(job_cgroups(job_id)) & remove_netns(job_id)


def left_behind(job_id: str) -> bool:
    """Whether the job's network namespace or any of its cgroup folders is still there."""
    return (NETNS_DIR / netns_name(job_id)).exists() or any(p.is_dir() for p in job_cgroups(job_id))


# A fresh, isolated interpreter tries what the unprivileged sandbox needs: user, mount, PID, IPC, UTS and network
# namespaces in one unshare(2), which fails where unprivileged user namespaces are off.
_USERNS_PROBE = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
                 "os._exit(0 if libc.unshare(0x10000000 | 0x00020000 | 0x20000000 | 0x08000000 | 0x04000000 "
                 "| 0x40000000) == 0 else 1)")


@cache
def _userns_unavailable() -> str:
    if os.uname().machine not in ("x86_64", "aarch64"):
        return f"the unprivileged sandbox does not know pivot_root's system call number on {os.uname().machine}"
    try:
        ok = subprocess.run([sys.executable, "-I", "-S", "-c", _USERNS_PROBE], timeout=10,
                            capture_output=True, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError) as e:
        return f"probing user namespaces failed: {e}"
    return "" if ok else ("the platform does not run as root and the kernel refuses it unprivileged user "
                          "namespaces (kernel.unprivileged_userns_clone, user.max_user_namespaces)")


def kind() -> Isolation:
    """The sandbox this machine gives when it gives one: the root one, or the user-namespace one without root."""
    return Isolation.SANDBOX if os.geteuid() == 0 else Isolation.USERNS


def unavailable() -> str:
    """Why this machine cannot sandbox a learner; "" when it can.

    As root, the sandbox needs the cgroup v1 memory, cpu and pids
    controllers and `ip` for the job's network namespace; without root, it
    needs unprivileged user namespaces (and gets no cgroups).
    """
    if os.geteuid() != 0:
        return _userns_unavailable()
    missing = [c for c in CGROUP_CONTROLLERS if not os.access(CGROUP_ROOT / c, os.W_OK)]
    if missing:
        return f"no writable cgroup v1 {', '.join(missing)} controller under {CGROUP_ROOT}"
    if not os.path.exists("/proc/self/ns/net") or not os.path.exists("/proc/self/ns/pid"):
        return "the kernel has no network or PID namespaces"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    return ""


def describe(setting: str, require: bool, egress: str = "none") -> str:
    """One line for `trainforge up`: what learners will run in under TF_ISOLATION / TF_REQUIRE_ISOLATION, and
    the most egress a sandboxed one may get (TF_EGRESS; teams' own policies narrow it)."""
    why = "TF_ISOLATION=none" if setting == "none" else unavailable()
    if not why and kind() is Isolation.USERNS:
        return ("learners: sandboxed without root (isolation: userns: own filesystem view, user, network and PID "
                "namespaces; NO cgroup limits, which need root: memory by the controller's watchdog, no cpu or "
                f"pids limit; egress at most: {egress or 'none'})")
    if not why:
        return ("learners: sandboxed (own filesystem view, uid, network and PID namespaces, cgroup limits; "
                f"egress at most: {egress or 'none'})")
    if require or setting == "sandbox":
        return f"learners: REFUSED - a sandbox is required but {why}"
    return (f"learners: NOT isolated (isolation: none) - {why}; a job can read the platform's credentials and "
            "files, reach its servers and signal its processes; set TF_REQUIRE_ISOLATION=true to refuse such jobs")

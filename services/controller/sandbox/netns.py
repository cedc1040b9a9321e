"""The job's private network: one network namespace, `tf-<job>`, with only loopback up.

Every learner of a job joins it, so the DDP rendezvous on 127.0.0.1 works
between ranks while nothing on the host's loopback (etcd, the Mongo-wire
server, the log store, the API, the Trainer) is reachable, and there is no
route out: egress is none, except what the job's egress policy has the
controller relay (egress.py). The first controller of the job to get here
creates it, under a lock so a second one never joins a half-made namespace;
the local backend's stop deletes it (trainforge_services.common.isolation.remove_job).

The namespace is made in-process, as `ip netns add` + `ip -n <ns> link set
lo up` would make it, without exec'ing `ip` twice per learner: a short-lived
thread of the controller unshares a network namespace of its own (a network
namespace belongs to a thread, so the controller's other threads and their
connections stay where they are), bind-mounts it on `/run/netns/tf-<job>`
(the run folder made a shared mount point first, as `ip` does, so the mount
is seen from every mount namespace), brings `lo` up with SIOCSIFFLAGS and
ends; nothing has to be switched back. Where that fails (no ioctl, a kernel
that refuses the mount), what it made is removed and `ip` does it as before;
the OSError when both fail names both. `add_address` (egress.py) is `ip -n
<ns> addr add <a>/32 dev lo` the same way: one RTM_NEWADDR over rtnetlink
from a thread inside the namespace, `ip` as the fallback.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import logging
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from trainforge_services.common.isolation import NETNS_DIR, NETNS_LOCKS, netns_name

from .userns import add_loopback_address, lo_up

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
MS_BIND, MS_REC, MS_SHARED = 0x1000, 0x4000, 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    if out.returncode != 0:
        raise OSError(f"ip {' '.join(args)} failed: {out.stderr.strip() or out.returncode}")


def _in_thread(work: Callable[[], None], name: str) -> None:
    """Run `work` in a thread of its own, which ends with it (with whatever namespace it joined); its OSError
    here (anything else it raised, as an OSError)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            failed.append(e)

    # not a Loop: a one-shot thread that must end with the namespace it joined
    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    t.join()
    if failed:
        raise failed[0] if isinstance(failed[0], OSError) else OSError(f"{type(failed[0]).__name__}: {failed[0]}")


def _shared_run_dir() -> None:
    """/run/netns a shared mount point (bound onto itself first when it is not one), as `ip netns add` makes it."""
    NETNS_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    run_dir = os.fsencode(NETNS_DIR)
    if _libc.mount(b"", run_dir, b"none", MS_SHARED | MS_REC, None) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:
        _check(-1, f"mount --make-rshared {NETNS_DIR}")
    _check(_libc.mount(run_dir, run_dir, b"none", MS_BIND | MS_REC, None), f"mount --rbind {NETNS_DIR} {NETNS_DIR}")
    _check(_libc.mount(b"", run_dir, b"none", MS_SHARED | MS_REC, None), f"mount --make-rshared {NETNS_DIR}")


def _unmount(path: Path) -> None:
    _libc.umount2(os.fsencode(path), 2)  # MNT_DETACH; not mounted (EINVAL) is fine
    path.unlink(missing_ok=True)


def create(path: Path) -> None:
    """`ip netns add` + `ip -n <ns> link set lo up` in-process; OSError (and nothing left behind) when it fails."""
    _shared_run_dir()
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))

    def work() -> None:
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        _check(_libc.mount(b"/proc/thread-self/ns/net", os.fsencode(path), b"none", MS_BIND, None),
               f"bind-mount the new network namespace on {path}")
        lo_up()

    try:
        _in_thread(work, "netns-create")
    except OSError:
        _unmount(path)
        raise


def path_of(job_id: str) -> Path:
    return NETNS_DIR / netns_name(job_id)


def ensure(job_id: str) -> Path:
    """The job's namespace file, made (loopback up) when it is not there yet; OSError when that fails."""
    name = netns_name(job_id)
    path = NETNS_DIR / name
    NETNS_LOCKS.mkdir(parents=True, exist_ok=True)
    with open(NETNS_LOCKS / name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            try:
                create(path)
            except OSError as inproc:
                try:
                    _ip("netns", "add", name)
                    _ip("-n", name, "link", "set", "lo", "up")
                except (OSError, subprocess.SubprocessError) as e:
                    raise OSError(f"cannot make the job's network namespace {name}: in-process: {inproc}; "
                                  f"with ip: {e}") from e
                log.warning("network namespace %s made with ip: the in-process path failed: %s", name, inproc)
    return path


def add_address(netns_path: Path, name: str, addr: str) -> None:
    """Put a non-loopback IPv4 `addr` on the namespace's loopback (`ip -n <name> addr add <addr>/32 dev lo`):
    in-process from a thread that joins the namespace, `ip` where that fails; OSError naming both."""
    if ipaddress.IPv4Address(addr).is_loopback:
        return

    def work() -> None:
        fd = os.open(netns_path, os.O_RDONLY)
        try:
            _check(_libc.setns(fd, CLONE_NEWNET), f"setns {netns_path}")
        finally:
            os.close(fd)
        add_loopback_address(addr)

    try:
        _in_thread(work, "netns-address")
    except OSError as inproc:
        try:
            out = subprocess.run(["ip", "-n", name, "addr", "add", f"{addr}/32", "dev", "lo"], capture_output=True,
                                 text=True, timeout=10, check=False)
            if out.returncode != 0 and "exists" not in out.stderr:
                raise OSError(out.stderr.strip() or f"exit status {out.returncode}")
        except (OSError, subprocess.SubprocessError) as e:
            raise OSError(f"cannot add {addr}/32 to lo in {name}: in-process: {inproc}; with ip: {e}") from e

"""The unprivileged sandbox's namespaces: a per-job holder that owns a user and a network namespace.

Without root there is no `ip netns` and no cgroup to write, but the kernel
lets any user make a user namespace and, inside it, namespaces it owns. So
the first controller of a job starts a *holder*:

    python -I -S userns.py hold <pid file>

which unshares a user namespace (uid and gid 0 inside mapped to the
platform's own outside, nothing else) and a network namespace with only
loopback up, writes its pid to `<pid file>` and then does nothing until
the job ends. Every rank's entry (enter.py) joins both with setns(2) as
their owner, so the ranks of a job share loopback (DDP rendezvous) and see
nothing of the host's. The holder runs with the job's TF_JOB_ID and a
TF_WORKDIR inside the job's folder, so the local backend's stop (KillJob)
ends it with the job's other processes; it also exits by itself when its
pid file is gone (the job's folder removed).

Egress relays (egress.py) need listening sockets inside that network
namespace, which a thread of the controller cannot enter (setns into a user
namespace needs a single-threaded process). So

    python -I -S userns.py listen <holder pid> <fd> <addr:port>...

joins the holder's namespaces, puts a non-loopback IPv4 address on the
namespace's loopback (one RTM_NEWADDR over rtnetlink, `ip` where that
fails), binds and listens, and passes the sockets back over the unix socket `<fd>` (SCM_RIGHTS); the controller accepts on
them and relays from the host side as in the root sandbox.

Only the standard library is used; the script half runs isolated.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
# rtnetlink: RTM_NEWADDR with an ack, created only if absent (what `ip addr add` asks for)
RTM_NEWADDR, NLMSG_ERROR = 20, 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFA_ADDRESS, IFA_LOCAL = 1, 2
START_TIMEOUT = 10.0
_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def write_map(path: str, inside: int, outside: int) -> None:
    with open(path, "w") as f:
        f.write(f"{inside} {outside} 1\n")


def map_self(inside: int, uid: int, gid: int) -> None:
    """After unshare(CLONE_NEWUSER): be `inside` there, as `uid`/`gid` outside (the one mapping allowed)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    write_map("/proc/self/uid_map", inside, uid)
    write_map("/proc/self/gid_map", inside, gid)


def join(pid: int) -> None:
    """Enter the holder's user namespace (full capabilities there, as its owner) and then its network namespace."""
    fds = [os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY) for ns in ("user", "net")]
    try:
        for fd, kind, name in zip(fds, (CLONE_NEWUSER, CLONE_NEWNET), ("user", "net"), strict=True):
            _check(_libc.setns(fd, kind), f"setns into the job's {name} namespace (holder pid {pid})")
    finally:
        for fd in fds:
            os.close(fd)


def lo_up() -> None:
    """`ip link set lo up` in the calling thread's network namespace (SIOCSIFFLAGS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def add_loopback_address(addr: str) -> None:
    """`ip addr add <addr>/32 dev lo` in the calling thread's network namespace, as one RTM_NEWADDR over
    rtnetlink (scope global, as `ip` gives an address outside 127/8); one already there is fine; OSError else."""
    packed = socket.inet_aton(addr)
    attrs = struct.pack("HH4s", 8, IFA_LOCAL, packed) + struct.pack("HH4s", 8, IFA_ADDRESS, packed)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        body = struct.pack("BBBBI", socket.AF_INET, 32, 0, 0, socket.if_nametoindex("lo")) + attrs
        flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE
        s.bind((0, 0))
        s.settimeout(START_TIMEOUT)
        s.send(struct.pack("IHHII", 16 + len(body), RTM_NEWADDR, flags, 1, 0) + body)
        reply = s.recv(65536)
    if len(reply) < 20 or struct.unpack_from("H", reply, 4)[0] != NLMSG_ERROR:
        raise OSError(f"rtnetlink answered adding {addr}/32 to lo with something other than an ack")
    err = -struct.unpack_from("i", reply, 16)[0]
    if err not in (0, errno.EEXIST):
        raise OSError(err, f"adding {addr}/32 to lo: {os.strerror(err)}")


def _hold(pid_file: str) -> int:
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare(user, net)")
    map_self(0, uid, gid)
    lo_up()
    tmp = f"{pid_file}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, pid_file)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        time.sleep(2)
        try:
            if int(Path(pid_file).read_text()) != os.getpid():
                return 0
        except (OSError, ValueError):
            return 0


def _listen(pid: int, fd: int, routes: list[str]) -> int:
    join(pid)
    made = []
    for route in routes:
        addr, port = route.rsplit(":", 1)
        if not ipaddress.IPv4Address(addr).is_loopback:
            try:
                add_loopback_address(addr)
            except OSError as inproc:
                try:
                    out = subprocess.run(["ip", "addr", "add", f"{addr}/32", "dev", "lo"], capture_output=True,
                                         text=True, timeout=10, check=False)
                    if out.returncode != 0 and "exists" not in out.stderr:
                        raise OSError(out.stderr.strip() or f"exit status {out.returncode}")
                except (OSError, subprocess.SubprocessError) as e:
                    raise OSError(f"cannot add {addr}/32 to lo: in-process: {inproc}; with ip: {e}") from e
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((addr, int(port)))
        s.listen(64)
        made.append(s)
    with socket.socket(fileno=fd) as back:
        socket.send_fds(back, [b"ok"], [s.fileno() for s in made])
    return 0


# --- the controller's side ---------------------------------------------------------------------------------------


def _alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
        return pid if Path(f"/proc/{pid}/ns/user").exists() else None
    except (OSError, ValueError):
        return None


def ensure(pid_file: Path, env: dict[str, str], python: str = sys.executable) -> int:
    """The job's holder pid, started (detached, in a session of its own) when none is alive; OSError when it
    cannot be. Two ranks never start two: they take the same lock."""
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{pid_file}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pid = _alive(pid_file)
        if pid is not None:
            return pid
        pid_file.unlink(missing_ok=True)
        proc = subprocess.Popen([python, "-I", "-S", __file__, "hold", str(pid_file)], env=env,
                                cwd=pid_file.parent, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while (pid := _alive(pid_file)) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                err = proc.communicate()[1].decode(errors="replace").strip().splitlines()
                raise OSError(f"the job's user namespace holder did not start: {err[-1] if err else 'no output'}")
            time.sleep(0.01)
        proc.stderr.close()
        return pid


def listen_in(holder: int, addresses: list[tuple[str, int]], python: str = sys.executable) -> list[socket.socket]:
    """Listening TCP sockets bound inside the holder's network namespace, made by a helper that joins it."""
    if not addresses:
        return []
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with mine:
        try:
            proc = subprocess.Popen([python, "-I", "-S", __file__, "listen", str(holder), str(theirs.fileno()),
                                     *(f"{a}:{p}" for a, p in addresses)], pass_fds=[theirs.fileno()],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        finally:
            theirs.close()
        mine.settimeout(START_TIMEOUT)
        try:
            _, fds, _, _ = socket.recv_fds(mine, 16, len(addresses))
        except OSError:
            fds = []
        err = proc.communicate(timeout=START_TIMEOUT)[1].decode(errors="replace").strip().splitlines()
    if len(fds) != len(addresses):
        for fd in fds:
            os.close(fd)
        raise OSError(f"cannot listen in the job's network namespace: {err[-1] if err else 'no sockets came back'}")
    return [socket.socket(fileno=fd) for fd in fds]


if __name__ == "__main__":
    try:
        if sys.argv[1:2] == ["hold"] and len(sys.argv) == 3:
            code = _hold(sys.argv[2])
        elif sys.argv[1:2] == ["listen"] and len(sys.argv) >= 4:
            code = _listen(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
        else:
            print("usage: userns.py hold <pid file> | listen <holder pid> <fd> <addr:port>...", file=sys.stderr)
            code = 2
    except OSError as e:
        print(f"trainforge sandbox: {e}", file=sys.stderr)
        code = 1
    sys.exit(code)

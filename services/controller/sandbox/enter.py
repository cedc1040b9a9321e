"""Puts one learner into its sandbox: run as root by the controller, in place of the guard and the shell.

    python -I -S enter.py --lifeline <fd> [--hold <fd>] <config.json> /bin/sh -c <command>

It leads the learner's process group and keeps the guard's promise itself
(services/controller/guard.py): `<fd>` is the read end of a pipe whose only
write end the controller holds, and when that closes (the controller died,
even by SIGKILL) the whole group is SIGKILLed, pid 1 of the learner's PID
namespace with it. So a sandboxed learner costs one platform interpreter,
not two (the guard's start was ~15-20 ms of CPU per learner). Without
`--lifeline` it runs under a guard as before.

The config (written by services/controller/sandbox/view.py) names the
job's network namespace, the learner's cgroups, what of the host is seen
read-only, the writable working directory and the uid/gid to run as.

Steps, as root on the host side: join the cgroups (so everything started
from here is counted), join the job's network namespace, then unshare a
mount, PID, IPC and UTS namespace and fork. The child is pid 1 of the new
PID namespace: it builds the filesystem view on a private tmpfs (binds,
/proc, /dev, /tmp), chroots into it, drops to the learner's uid with no
capabilities and no_new_privs, and runs the command. When pid 1 exits, the
kernel kills everything left in the namespace, so nothing a learner
starts, even in a session of its own, outlives it.

With `--hold` (a prestarted trial's learner, held until its gate opens; the
guard's --hold, services/controller/guard.py), pid 1 builds the whole view,
drops to the learner's uid and then blocks reading the hold pipe before it
starts the command: a byte starts it, end-of-file exits EXIT_NOT_STARTED
without running anything of the user's. With `--pass-hold` instead (a
command that is a Python interpreter holding itself, pyhold.py), pid 1
starts the command at once, the hold pipe left open and named in its
environment (TF_LEARNER_HOLD_FD), and the learners' start-up hook blocks on
it before the user's program runs.

pid 1 exits with the command's status as soon as the command is done,
except after a SIGTERM (a stop or halt): the shell dies at once while the
program it started may still be saving a checkpoint, so it then waits for
every process of the namespace; the controller's grace period and SIGKILL
bound that wait. The host-side parent mirrors pid 1's exit (code or
signal), so to the controller this looks exactly like the shell.

A SIGTERM or SIGINT that comes before the command exists (a stop while the
interpreter starts, the sandbox is built or the learner is held) is not
lost, as the guard's is not: both are blocked from the entry's first line
until the command is spawned, so one that came is pending then. Before the
fork the entry dies of it; after, pid 1 does not start the command and
exits as killed by it. One that came just before the fork is pending in the
parent alone, so pid 1 waits for the parent's word (a byte on a pipe)
before it looks: the parent first hands it what it holds. One that comes
during the spawn is passed on to the shell. Were it caught and forgotten,
the command would start, never see it and be SIGKILLed once the grace
period ran out.

Without root (`isolation: userns`, the config names the job's namespace
holder, userns.py): the entry joins the holder's user namespace, where it
is root with every capability over what that namespace owns but only the
platform's own uid outside, and its network namespace; there are no
cgroups to join. pid 1 builds the same view (without the host's /sys),
then pivot_root(2)s into it and detaches the old root, so nothing of the
host's mount tree is left to escape to, and finally unshares a user
namespace of its own in which the learner is uid 1000 (the holder's root
outside), so the command starts with no capability at all.

Only the standard library is used (ctypes for the system calls Python 3.11
lacks), and the interpreter runs isolated, so nothing of the user's
environment is imported with root privileges (userns.py is a sibling
file of this one, imported from this folder only, and only in userns mode).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import signal
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = (
    0x00020000, 0x04000000, 0x08000000, 0x20000000, 0x40000000)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
PR_SET_NO_NEW_PRIVS = 38
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
# Mount flags a bind keeps from its source (a user namespace may not clear them): read-only, nosuid, nodev,
# noexec, noatime, nodiratime; statvfs(3) and mount(2) number them alike.
KEPT_FLAGS = 1 | 2 | 4 | 8 | 1024 | 2048
LEARNER_UID = 1000  # the learner's uid in its own user namespace (userns mode)
# Where the new root is built, inside the private mount namespace only.
STAGE = "/run/trainforge/sandbox-root"
EXIT_SETUP = 126  # the sandbox could not be built; the learner never ran
EXIT_NOT_STARTED = 125  # held, and the hold was given up: the command never started (guard.py's)
HOLD_FD_ENV = "TF_LEARNER_HOLD_FD"  # names the hold pipe for a command that holds itself (guard.py's)

_libc = ctypes.CDLL(None, use_errno=True)


def _userns():  # noqa: ANN202 - the sibling script, loaded only in userns mode
    """The sibling script userns.py, imported only without root (`holder` set): it imports socket,
    subprocess and more for its controller-side half, ~20 ms of CPU a root sandbox never needs. Loaded
    while the host's tree is still visible (before the pivot), and cached from then on."""
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import userns  # noqa: PLC0415 - standard library only

    return userns


class SetupError(Exception):
    pass


# The signals meant for the learner; blocked until the command exists (see the docstring).
_FORWARDED = (signal.SIGTERM, signal.SIGINT)


def _pending() -> list[int]:
    """The forwarded signals that came while blocked and wait to be delivered."""
    pending = signal.sigpending()
    return [sig for sig in _FORWARDED if sig in pending]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), ctypes.c_ulong(flags),
                       data and data.encode()), f"mount {src} on {dst}")


def _target(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _bind(root: str, src: str, dst: str, *, writable: bool) -> None:
    """Bind src at dst under root; a symlink is recreated as one (merged-/usr systems' /bin -> usr/bin)."""
    target = _target(root, dst)
    if os.path.islink(src) and src == dst:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(os.readlink(src), target)
        return
    if os.path.isdir(src):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()
    _mount(src, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | (0 if writable else MS_RDONLY) | (os.statvfs(target).f_flag
                                                                              & KEPT_FLAGS)
    if not src.startswith("/dev/"):
        flags |= MS_NODEV
    _mount(None, target, None, flags)


_PRIVATE = ("/tmp", "/dev/shm")


def _build_root(cfg: dict, root: str) -> str:
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    # A read-only folder under /tmp or /dev/shm (a job environment cached there) is bound after the private
    # tmpfs is mounted over those, or the tmpfs would hide it.
    late = [p for p in cfg["readonly"] if any(p == t or p.startswith(t + "/") for t in _PRIVATE)]
    for path in cfg["readonly"]:
        if path not in late and os.path.lexists(path):
            _bind(root, path, path, writable=False)
    if cfg.get("hosts") and os.path.isfile(os.path.join(root, "etc/hosts")):  # the names its egress allows
        _bind(root, cfg["hosts"], "/etc/hosts", writable=False)
    for src, dst in cfg.get("aliases", []):  # a symlinked path (a venv link) seen at its own name
        if not os.path.lexists(_target(root, dst)):
            _bind(root, src, dst, writable=False)
    for sub, flags in (("proc", MS_NOSUID | MS_NODEV | MS_NOEXEC),):
        os.makedirs(_target(root, sub), exist_ok=True)
        _mount(sub, _target(root, sub), sub, flags)
    dev = _target(root, "dev")
    os.makedirs(dev, exist_ok=True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for node in cfg["devices"]:
        if os.path.exists(node):
            _bind(root, node, node, writable=True)
    for link, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                     ("stderr", "/proc/self/fd/2")):
        os.symlink(to, os.path.join(dev, link))
    uid, gid = cfg["uid"], cfg["gid"]
    for sub, size in (("dev/shm", cfg["shm_size"]), ("tmp", cfg["tmp_size"])):
        os.makedirs(_target(root, sub), exist_ok=True)
        _mount("tmpfs", _target(root, sub), "tmpfs", MS_NOSUID | MS_NODEV,
               f"mode=1777,size={size},uid={uid},gid={gid}")
    for path in late:
        if os.path.lexists(path):
            _bind(root, path, path, writable=False)
    _bind(root, cfg["workdir"], cfg["workdir"], writable=True)
    return root


def _seal(root: str) -> None:
    """Everything above the workdir is the tmpfs' own folders: searchable, not writable, by the learner."""
    _mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _pivot(root: str) -> None:
    """Make `root` the mount namespace's root and detach the host's tree under it (userns mode)."""
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise SetupError(f"pivot_root: no system call number known for {os.uname().machine}")
    os.chdir(root)
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")


def _become_learner() -> None:
    """userns mode: a user namespace of pid 1's own, where it is LEARNER_UID and execs with no capability."""
    userns = _userns()
    _check(_libc.unshare(userns.CLONE_NEWUSER), "unshare(user)")
    userns.map_self(LEARNER_UID, 0, 0)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # a non-zero uid clears every capability
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def _released(hold: int) -> bool:
    """Block on the hold pipe: True once the controller wrote to it, False at end-of-file (given up)."""
    try:
        return bool(os.read(hold, 1))
    finally:
        os.close(hold)  # the learner never sees it


def _pid1(cfg: dict, command: list[str], hold: int | None = None, handed: int | None = None,
          passed: bool = False) -> int:
    """pid 1 of the learner's PID namespace: build the view, drop root, run the command, reap. `handed`: the
    pipe end on which the parent says it handed over the stop signals that came before the fork; `passed`:
    the hold pipe goes to the command, which holds itself, instead of being waited on here."""
    stopping = False

    def on_stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    # The forwarded signals are still blocked (main): one sent while the view is built waits, pending, for
    # the look before the command starts. (Blocked, pid 1 is sent one from outside even without a handler.)
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        root = _build_root(cfg, cfg.get("stage") or STAGE)
        if cfg.get("holder"):
            _pivot(root)
            _seal("/")
        else:
            _seal(root)
            os.chroot(root)
        os.chdir(cfg["workdir"])
        _check(_libc.sethostname(b"learner", 7), "sethostname")
        if cfg.get("holder"):
            _become_learner()
        else:
            _drop_privileges(cfg["uid"], cfg["gid"])
    except (SetupError, OSError) as e:
        print(f"trainforge sandbox: cannot build the learner's sandbox: {e}", file=sys.stderr)
        return EXIT_SETUP
    if passed and hold is not None:
        os.set_inheritable(hold, True)
        os.environ[HOLD_FD_ENV] = str(hold)
    elif hold is not None and not _released(hold):
        return EXIT_NOT_STARTED
    if handed is not None:
        os.read(handed, 1)  # end-of-file too: the parent is gone, and the group with it
        os.close(handed)
    if early := _pending():
        return -early[0]  # stopped before the command started: it never starts
    try:
        child = os.posix_spawn(command[0], command, os.environ,
                               setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, *_FORWARDED), setsigmask=())
    except OSError as e:
        print(f"cannot start {command[0]}: {e}", file=sys.stderr)
        return 127
    finally:
        if passed and hold is not None:
            os.close(hold)  # the command's to read
    for sig in _pending():
        os.kill(child, sig)  # came during the spawn, maybe before the fork: the command's
    # pid 1 gets a signal from outside only when it has a handler; the rest of the group gets it anyway.
    for sig in _FORWARDED:
        signal.signal(sig, on_stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)  # one pending now says stopping
    code = None
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            if not stopping and code != -signal.SIGTERM:
                break  # done: what it left behind dies with the namespace
    return code if code is not None else 1


def _mirror(code: int) -> None:
    """Exit the way pid 1 did: the same code, or killed by the same signal."""
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, (-code,))
        os.kill(os.getpid(), -code)
        os._exit(128 - code)
    os._exit(code)


def _wait_watching(pid: int, lifeline: int) -> int:
    """waitpid(pid) that keeps the guard's promise (services/controller/guard.py) meanwhile, so no guard
    interpreter is needed: the controller holds the only write end of `lifeline`; when it dies, even by
    SIGKILL, the read returns end-of-file and this whole process group goes, pid 1 of the learner's
    namespace with it (and so everything in it). A controller that died before this is seen at once.

    No thread: after unshare(CLONE_NEWPID) this process cannot start one. A pidfd tells when pid 1 exited
    (without one, the child is looked at every 50 ms)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    poller = select.poll()
    poller.register(lifeline, select.POLLIN | select.POLLHUP)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        for fd, _ in poller.poll(None if pidfd is not None else 50):
            if fd == lifeline and not os.read(lifeline, 4096):  # the controller never writes
                os.killpg(0, signal.SIGKILL)


def _arguments(argv: list[str]) -> tuple[int | None, int | None, bool, str, list[str]]:
    """(lifeline fd or None, hold fd or None, whether the hold is passed on, config path, command) from
    `[--lifeline FD] [--hold FD | --pass-hold FD] <config.json> <program> [args...]`."""
    fds: dict[str, int | None] = {"--lifeline": None, "--hold": None, "--pass-hold": None}
    for flag in fds:
        if len(argv) > 2 and argv[1] == flag:
            if not argv[2].isdigit():
                raise ValueError(f"{flag} needs a file descriptor number, not {argv[2]!r}")
            fds[flag], argv = int(argv[2]), argv[:1] + argv[3:]
    if len(argv) < 3 or argv[1] in fds:
        raise ValueError("usage: enter.py [--lifeline FD] [--hold FD | --pass-hold FD] <config.json> "
                         "<program> [args...]")
    if fds["--hold"] is not None and fds["--pass-hold"] is not None:
        raise ValueError("--hold and --pass-hold: one hold or the other, not both")
    passed = fds["--pass-hold"] is not None
    return fds["--lifeline"], fds["--pass-hold"] if passed else fds["--hold"], passed, argv[1], argv[2:]


def main(argv: list[str]) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)  # until the command exists (see the docstring)
    try:
        lifeline, hold, passed, config, command = _arguments(argv)
    except ValueError as e:
        print(e, file=sys.stderr)
        os._exit(EXIT_SETUP)
    if lifeline is not None:
        os.set_inheritable(lifeline, False)  # the lifeline is ours, not the learner's
    with open(config) as f:
        cfg = json.load(f)
    try:
        if cfg.get("holder"):
            _userns().join(cfg["holder"])  # its user namespace, then its network namespace
        else:
            for procs in cfg["cgroups"]:
                with open(procs, "w") as f:
                    f.write(str(os.getpid()))
            fd = os.open(cfg["netns"], os.O_RDONLY)
            _check(_libc.setns(fd, CLONE_NEWNET), f"setns {cfg['netns']}")
            os.close(fd)
            os.makedirs(STAGE, mode=0o700, exist_ok=True)
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    except (SetupError, OSError) as e:
        print(f"trainforge sandbox: cannot enter the learner's namespaces: {e}", file=sys.stderr)
        os._exit(EXIT_SETUP)
    if early := _pending():
        _mirror(-early[0])  # stopped before anything of the learner's started: nothing starts
    # pid 1 cannot die of a signal it sends itself, so it tells how the command ended through a pipe.
    told, tell = os.pipe()
    handed, hand = os.pipe()
    pid = os.fork()  # the child inherits the blocked signals, not the pending ones
    if pid == 0:
        os.close(told)
        os.close(hand)
        if lifeline is not None:
            os.close(lifeline)
        try:
            code = _pid1(cfg, command, hold, handed, passed)
        except BaseException as e:  # noqa: BLE001 - pid 1 must exit with a code, never a traceback
            print(f"trainforge sandbox: {type(e).__name__}: {e}", file=sys.stderr)
            code = EXIT_SETUP
        os.write(tell, str(code).encode())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code & 0xFF if code >= 0 else 128 - code)
    os.close(tell)
    os.close(handed)
    for sig in _pending():
        os.kill(pid, sig)  # came just before the fork, so pid 1 lacks it: blocked there, it stops the start
    with contextlib.suppress(OSError):  # pid 1 may have ended already (its setup failed)
        os.write(hand, b"\n")  # pid 1 looks at its pending signals only after this
    os.close(hand)
    for sig in _FORWARDED:
        signal.signal(sig, lambda *_: None)  # meant for the learner; its group gets them too
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
    if hold is not None:
        os.close(hold)  # pid 1's to read; here it would only keep the pipe open
    if lifeline is not None:
        status = _wait_watching(pid, lifeline)
    else:
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno != errno.EINTR:
                    raise
    code = os.waitstatus_to_exitcode(status)
    said = os.read(told, 64).decode()
    if code >= 0 and said.lstrip("-").isdigit():
        code = int(said)
    _mirror(code)


if __name__ == "__main__":
    main(sys.argv)

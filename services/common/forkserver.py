"""A warm fork server: `python -m <module> <args>` without paying the interpreter's start and imports again.

`python -m trainforge_services.common.forkserver --socket PATH --preload MODULE... [--warm MODULE...]
--title-room SPACES` imports each preloaded MODULE's `__main__` and each warm
MODULE (calling its `warm()`, which imports what it would load on first use),
and nothing else: no gRPC channel, etcd client, thread or log-store client
exists before a fork. It then listens on PATH, a unix socket only its own
user may use (mode 0600, and the peer's uid is checked). Each connection
carries one request, a JSON line `{"module", "args", "cwd", "env", "log",
"title"}`, and gets one JSON line back: `{"pid", "started"}` (the child's
psutil create time) or `{"error"}`, once the child has set itself up and
reported. Requests are served concurrently: the server forks a child and
takes the next request while the child sets up (one thread, a selector over
the listener and the children's report pipes).

The child calls setsid, so it leads its own session and process group
(pid = pgid = sid) like a process started with `start_new_session`, and
outlives the server and the LCM (it is then the init process's). The server
reaps its children at least twice a second (so none stays a zombie of it: a
single fork rather than a double one, as an orphan would become a zombie of
an init that does not reap, as on this project's VMs). The child closes the server's
sockets, points stdin at /dev/null and stdout/stderr at the log (appended),
changes into cwd, replaces `os.environ`, restores the signal handlers and
mask a fresh interpreter has, writes `title` over its own command line (so
`ps` and psutil see `python -m MODULE --spec …`, as for a spawned process:
the title room is the server's own argv, padded with spaces), then runs
MODULE as `__main__` with `sys.argv` set as `python -m` would, runs the
interpreter's exit steps (non-daemon threads, atexit) and exits with the
module's exit code. Learners are never started from here.

The server exits when its parent dies (the LCM that started it) or when its
socket path is taken over by another server.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback
from pathlib import Path

import psutil

# What a fresh interpreter has; the children get these back (the server changes none on purpose).
_SIGNALS = {s: signal.getsignal(s) for s in signal.valid_signals() if signal.getsignal(s) is not None}
_PATH0 = sys.path[0] if sys.path else ""
_READ_TIMEOUT = 5.0


def _log(message: str) -> None:
    sys.stderr.write(f"forkserver[{os.getpid()}]: {message}\n")
    sys.stderr.flush()


# -- the child ------------------------------------------------------------------------------------


def set_title(title: str) -> None:
    """Write title over this process's argv area (what /proc/<pid>/cmdline shows); ValueError when it does not fit.

    The kernel reads a command line whose last byte is not NUL up to its first
    NUL (the setproctitle convention), so the rest is padded with spaces.
    """
    stat = Path("/proc/self/stat").read_bytes()
    fields = stat[stat.rindex(b")") + 2:].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49 of proc(5)
    raw = title.encode()
    if b"\0" in raw or len(raw) + 1 > end - start:
        raise ValueError(f"a title of {len(raw)} bytes does not fit the {end - start} bytes of the command line")
    padded = raw + b"\0" + b" " * (end - start - len(raw) - 1)
    ctypes.memmove(start, padded, len(padded))


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def _run(module: str, args: list[str]) -> int:
    """Run module as `python -m module args` would, then the interpreter's exit steps; the exit code."""
    sys.argv = [module, *args]
    sys.orig_argv = [sys.executable, "-m", module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - what the interpreter would print for an uncaught exception
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads, as at interpreter exit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    return code


def _prepare(request: dict, report: int) -> None:
    """In the detached child: take on the request's cwd, output, environment and title; report pid and start."""
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    null = os.open(os.devnull, os.O_RDONLY)
    os.chdir(request["cwd"])
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(null)
    os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    if sys.path and sys.path[0] == _PATH0:
        sys.path[0] = os.getcwd()  # `python -m` puts its working directory first
    for sig, handler in _SIGNALS.items():
        try:
            if signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        except (OSError, ValueError):
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    set_title(request["title"])
    os.write(report, json.dumps({"pid": os.getpid(), "started": psutil.Process().create_time()}).encode())
    os.close(report)


def _child(request: dict, report: int, sockets: list[socket.socket], fds: list[int]) -> None:
    """The forked child: its own session, the request's setup, then the module; never returns."""
    try:
        for s in sockets:
            os.close(s.detach())  # detach: the objects must not close these numbers again later
        for fd in fds:  # other requests' report pipes, still open in the server
            os.close(fd)
        os.setsid()
        _prepare(request, report)
    except BaseException as e:  # noqa: BLE001 - anything that stops the child is the request's error
        try:
            os.write(report, json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
        finally:
            os._exit(127)
    os._exit(_run(request["module"], request["args"]))


# -- the server -----------------------------------------------------------------------------------


def start(request: dict, sockets: list[socket.socket], fds: list[int] = ()) -> int:
    """Fork the request's child; the read end of the pipe its report ({"pid", "started"} or {"error"}) comes on.

    `sockets` and `fds` are closed in the child (the server's, none of its business)."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        os.close(r)
        _child(request, w, sockets, list(fds))
    os.close(w)
    return r


def report_of(chunks: list[bytes]) -> dict:
    """The reply for what a child wrote on its report pipe before closing it."""
    if not chunks:
        return {"error": "the child exited before it started"}
    try:
        return json.loads(b"".join(chunks))
    except ValueError as e:
        return {"error": f"an unreadable report from the child: {e}"}


def fork(request: dict, sockets: list[socket.socket]) -> dict:
    """Start the request's child and wait for its report: {"pid", "started"} or {"error"}."""
    r = start(request, sockets)
    try:
        chunks = []
        while chunk := os.read(r, 4096):
            chunks.append(chunk)
    finally:
        os.close(r)
    return report_of(chunks)


def reap() -> None:
    """Collect the children that have exited, so none lingers as a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _check(request: object, modules: set[str]) -> dict:
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    missing = {"module", "args", "cwd", "env", "log", "title"} - request.keys()
    if missing:
        raise ValueError(f"the request lacks {', '.join(sorted(missing))}")
    if request["module"] not in modules:
        raise ValueError(f"module {request['module']!r} is not preloaded here (preloaded: {', '.join(sorted(modules))})")
    return request


class _Pending:
    """A request whose child was forked and has not reported yet: its connection and what the child wrote."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.chunks: list[bytes] = []


def _answer(conn: socket.socket, reply: dict) -> None:
    if "error" in reply:
        _log(reply["error"])
    try:
        conn.sendall(json.dumps(reply).encode() + b"\n")
    except OSError as e:
        _log(f"could not answer a request: {type(e).__name__}: {e}")
    finally:
        conn.close()


def _accept(conn: socket.socket, listener: socket.socket, modules: set[str],
            pending: dict[int, _Pending], selector: int) -> int | None:
    """Read one request and fork its child; the child's report pipe (None: answered already, or refused)."""
    uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
    if uid != os.getuid():
        _log(f"refused a request of uid {uid}")
        conn.close()
        return None
    conn.settimeout(_READ_TIMEOUT)
    try:
        with conn.makefile("rb") as f:
            line = f.readline()
        request = _check(json.loads(line), modules)
        others = [p.conn for p in pending.values()]
        return start(request, [listener, conn, *others], [*pending, selector])
    except (ValueError, OSError) as e:
        _answer(conn, {"error": f"{type(e).__name__}: {e}"})
        return None


def _collect(r: int, job: _Pending) -> bool:
    """Read what the child wrote on its report pipe; True once it closed it (the report is complete)."""
    try:
        chunk = os.read(r, 4096)
    except BlockingIOError:
        return False
    if chunk:
        job.chunks.append(chunk)
        return False
    return True


def serve(path: Path, modules: set[str], parent: int) -> None:
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(umask)
    os.chmod(path, 0o600)
    inode = path.stat().st_ino
    listener.listen(64)
    listener.setblocking(False)
    _log(f"serving {', '.join(sorted(modules))} on {path}")
    # Requests are served concurrently: the server forks a request's child and goes on to the next request
    # while the child sets itself up; the answer goes out when the child's report pipe closes. Waiting for
    # each child's report before the next fork made the server a queue on a loaded machine (a burst's
    # deploys took a fork round trip of ~0.2 s each, one after another).
    pending: dict[int, _Pending] = {}
    with selectors.DefaultSelector() as sel:
        sel.register(listener, selectors.EVENT_READ)
        while True:
            reap()
            try:
                if os.getppid() != parent or path.stat().st_ino != inode:
                    _log("parent gone or socket taken over; exiting")
                    return
            except FileNotFoundError:
                _log("socket removed; exiting")
                return
            for key, _ in sel.select(timeout=0.5):
                if key.fileobj is listener:
                    try:
                        conn, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    conn.setblocking(True)
                    r = _accept(conn, listener, modules, pending, sel.fileno())
                    if r is not None:
                        os.set_blocking(r, False)
                        pending[r] = _Pending(conn)
                        sel.register(r, selectors.EVENT_READ)
                    continue
                r = key.fd
                job = pending[r]
                try:
                    done = _collect(r, job)
                except OSError as e:
                    job.chunks, done = [], True
                    _log(f"reading a child's report failed: {type(e).__name__}: {e}")
                if done:
                    sel.unregister(r)
                    os.close(r)
                    del pending[r]
                    _answer(job.conn, report_of(job.chunks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainforge_services.common.forkserver",
                                     description="Fork preloaded `python -m` modules on request.")
    parser.add_argument("--socket", required=True, type=Path, help="unix socket to listen on")
    parser.add_argument("--preload", action="append", required=True, help="a module to run (its __main__ is imported)")
    parser.add_argument("--warm", action="append", default=[],
                        help="a module to import too; its warm() is called when it has one (it must start nothing)")
    parser.add_argument("--title-room", default="", help="padding: room for the children's command lines")
    parser.add_argument("--parent", type=int, default=0,
                        help="the pid of the process it serves (default: its parent at start); it exits once that "
                             "is no longer its parent, also when that died while the modules were imported")
    args = parser.parse_args(argv)
    parent = args.parent or os.getppid()
    for module in args.preload:
        importlib.import_module(f"{module}.__main__")
        # what it imported stays; the module itself is run afresh as __main__ (runpy warns when it is in sys.modules)
        del sys.modules[f"{module}.__main__"]
    for module in args.warm:
        warm = getattr(importlib.import_module(module), "warm", None)
        if warm:
            warm()
    serve(args.socket, set(args.preload), parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The local backend's side of the warm fork server (`trainforge_services.common.forkserver`).

The backend starts one server when it is built, with the same interpreter
and environment its controllers and monitors get, listening on
`<state_dir>/lcm/fork.sock` (or, when that path is too long for a unix
socket, on `fork.sock` in a private 0700 directory under the temp dir). A
request that the server cannot serve, for whatever reason, returns None and
the caller spawns the process as before: no job ever fails because of the
fork server. A server that is gone or does not answer is started again
(for the next request). A command line with a space in it is never sent
(its title would not read back as the same argv), nor one that is too long.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

_SERVER = "trainforge_services.common.forkserver"
_ROOM = 1536  # bytes of title room: the children's `python -m … --spec <path>`
_REPLY_TIMEOUT = 10.0
_START_WAIT = 10.0  # how long a request waits for a server that is still importing
_SOCKET_MAX = 100  # sun_path holds 108 bytes
_RESTART_GAP = 5.0  # a server that keeps failing is started again at most this often


def socket_path(state_dir: Path) -> Path:
    path = state_dir / "lcm" / "fork.sock"
    if len(os.fsencode(path)) <= _SOCKET_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(state_dir)).hexdigest()[:16]
    private = Path(tempfile.gettempdir()) / f"trainforge-fork-{os.getuid()}-{digest}"
    private.mkdir(mode=0o700, exist_ok=True)
    st = private.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError(f"{private} is not a private directory of this user")
    return private / "fork.sock"


class ForkServer:
    """One warm fork server of this backend, started now and again whenever it is found gone."""

    def __init__(self, python: str, state_dir: Path, env: dict[str, str], modules: list[str],
                 warm: list[str] | tuple[str, ...] = ()):
        self._python = python
        self._warm = list(warm)
        self._state = state_dir
        self._env = env
        self._modules = modules
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._started_at = 0.0
        self.path = socket_path(state_dir)
        self._start()

    def _start(self) -> None:
        argv = [self._python, "-m", _SERVER, "--socket", str(self.path), "--parent", str(os.getpid())]
        for module in self._modules:
            argv += ["--preload", module]
        for module in self._warm:
            argv += ["--warm", module]
        argv += ["--title-room", " " * _ROOM]
        (self._state / "lcm").mkdir(parents=True, exist_ok=True)
        self._started_at = time.monotonic()
        try:
            with open(self._state / "lcm" / "forkserver.log", "ab") as out:
                self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                              cwd=self._state, env=self._env)
        except OSError as e:
            log.warning("cannot start the fork server: %s", e)
            self._proc = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _restart(self, failed: subprocess.Popen | None, why: str) -> None:
        with self._lock:
            if self._proc is not failed:
                return  # another request restarted it already
            log.warning("fork server (pid %s): %s; this process is spawned instead", self.pid, why)
            if time.monotonic() - self._started_at >= _RESTART_GAP:
                self._stop()
                self._start()
            elif failed is not None and failed.poll() is not None:
                self._proc = None  # started again once the gap is over

    def _connect(self, proc: subprocess.Popen | None) -> socket.socket:
        """A connection to the server, waiting for one that is still importing; OSError when there is none."""
        if proc is None:
            raise ConnectionError("no fork server runs")
        deadline = time.monotonic() + _START_WAIT
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.path))
                return sock
            except OSError:
                sock.close()
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
            time.sleep(0.02)

    def spawn(self, argv: list[str], cwd: Path, log_path: Path, env: dict[str, str]) -> tuple[int, float] | None:
        """Start `argv` (`<python> -m <module> <args>`) from the server: (pid, start time), or None to spawn it."""
        if len(argv) < 3 or argv[0] != self._python or argv[1] != "-m" or argv[2] not in self._modules:
            return None
        title = " ".join(argv)
        if any(" " in a or not a for a in argv) or len(title.encode()) >= _ROOM:
            return None
        if any(env.get(k) != self._env.get(k) for k in {*env, *self._env} if k.startswith("PYTHON")):
            return None  # read when an interpreter starts: the server's would not be the child's
        request = {"module": argv[2], "args": argv[3:], "cwd": str(cwd), "env": env, "log": str(log_path),
                   "title": title}
        proc = self._proc
        try:
            with self._connect(proc) as sock:
                sock.settimeout(_REPLY_TIMEOUT)
                sock.sendall(json.dumps(request).encode() + b"\n")
                with sock.makefile("rb") as f:
                    reply = json.loads(f.readline() or b"{}")
        except (OSError, ValueError) as e:
            self._restart(proc, f"no answer ({type(e).__name__}: {e})")
            return None
        if "error" in reply:
            log.warning("fork server could not start %s: %s; spawning it", argv[2], reply["error"])
            return None
        try:
            return int(reply["pid"]), float(reply["started"])
        except (KeyError, TypeError, ValueError):
            self._restart(proc, f"a reply without pid: {reply!r}")
            return None

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        with self._lock:
            self._stop()


def enabled(setting: bool, python: str) -> bool:
    """The fork server serves the LCM's own interpreter only (a configured other one is spawned as before)."""
    return setting and python in ("", sys.executable)

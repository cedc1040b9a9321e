"""`python -m trainforge_frameworks.podwaiter <hand-off dir>`: a kubernetes learner pod's learner container entrypoint.

A learner pod has two containers (docs/KUBERNETES.md, "The controller: a
container of its own"): `controller`, which holds the job's credentials, and
`learner`, which holds none. They share no PID namespace, so the controller
cannot start or signal the learner itself: this waiter, pid 1 of the learner
container, does it for the controller. They meet in the hand-off directory,
an emptyDir both containers mount:

- the waiter listens on the unix socket `waiter.sock` there. The controller's
  hand-off (services/controller/handoff.py, the launcher the controller runs in place of the
  bare command) connects once the learner may start - after the job's gate,
  when it has one - and sends one JSON line: the learner's argv, environment
  (the one the controller built for it, without any platform setting) and
  working directory. That line is the go;
- the waiter starts the command in a session of its own, its stdout and
  stderr going to the files `stdout` and `stderr` there, which the hand-off
  copies to the controller (the controller archives and ships them as logs);
- a line `signal TERM` (or `INT`) from the hand-off is sent to the learner's
  process group. The hand-off is the controller's learner, so the
  controller's SIGKILL after the grace period kills it: the connection
  closes, and the waiter SIGKILLs the learner's group. A controller that dies
  any other way closes it too, so no learner runs unwatched;
- when the command ends (after a stop, once nothing of its group is left:
  the shell dies of SIGTERM at once while the program may still save its
  checkpoint), the waiter writes the exit code to `exit`, then the marker
  `end`, tells the hand-off `exit <code> <signal>` and exits with the code
  (128+N for a signal N), which ends the learner container.

The controller's entrypoint writes `controller.end` when the controller
exits: a waiter still waiting for its go then exits 0 without starting
anything (a halt or a failure before the learner started), so the pod ends
either way. The waiter's own SIGTERM (the pod is deleted) goes to the
learner's group too; the kubelet's grace period is the hard kill.

Only the standard library is used, and nothing here imports the platform: it starts in tens of
milliseconds, and the controller's hand-off imports only these names from it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SOCKET = "waiter.sock"
STDOUT = "stdout"
STDERR = "stderr"
EXIT = "exit"
END = "end"
CONTROLLER_END = "controller.end"
POLL = 0.05
EXIT_USAGE = 2
EXIT_CANNOT_START = 127
_SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT}


def _say(conn: socket.socket, line: str) -> None:
    try:
        conn.sendall(line.encode() + b"\n")
    except OSError:
        pass  # the hand-off is gone; the files still tell


class Waiter:
    def __init__(self, directory: Path):
        self.dir = directory
        self.pgid: int | None = None
        self.stopping = False  # a stop was asked for: wait for the whole group before reporting the end
        self.lost = False  # the hand-off's connection closed before the learner ended
        self.signalled: int | None = None  # a signal to the waiter itself, before any learner ran

    def signal_group(self, sig: int) -> None:
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def group_alive(self) -> bool:
        if self.pgid is None:
            return False
        try:
            os.killpg(self.pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def _on_signal(self, signum: int, _frame) -> None:
        self.stopping = True
        if self.pgid is None:
            self.signalled = signum
        self.signal_group(signum)

    def accept(self) -> socket.socket | None:
        """The hand-off's connection; None when the controller ended first (or the pod is being deleted)."""
        path = self.dir / SOCKET
        path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        os.chdir(self.dir)  # a socket's path is at most 107 bytes: bound by its name here
        server.bind(SOCKET)
        os.chmod(path, 0o660)  # the controller runs under another uid, in the pod's group
        server.listen(1)
        server.settimeout(POLL)
        try:
            while True:
                if self.signalled is not None or (self.dir / CONTROLLER_END).exists():
                    return None
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(None)
                return conn
        finally:
            server.close()
            path.unlink(missing_ok=True)

    def start(self, request: dict) -> subprocess.Popen:
        with open(self.dir / STDOUT, "ab") as out, open(self.dir / STDERR, "ab") as err:
            proc = subprocess.Popen(request["argv"], env=request["env"], cwd=request["cwd"],  # noqa: S603
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        self.pgid = proc.pid
        return proc

    def follow(self, reader) -> None:
        """The hand-off's lines after the request; its end (SIGKILLed after the grace, or its controller
        gone) SIGKILLs the learner's group."""
        for line in reader:
            word = line.decode(errors="replace").split()
            if len(word) == 2 and word[0] == "signal" and word[1] in _SIGNALS:
                self.stopping = True
                self.signal_group(_SIGNALS[word[1]])
        self.lost = True
        self.signal_group(signal.SIGKILL)

    def reap(self, pid: int) -> int | None:
        """Reap every ended child (pid 1 of a container inherits the learner's orphans); `pid`'s wait status."""
        status = None
        while True:
            try:
                got, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return status
            if got == 0:
                return status
            if got == pid:
                status = st

    def run(self) -> int:
        for sig in _SIGNALS.values():
            signal.signal(sig, self._on_signal)
        self.dir.mkdir(parents=True, exist_ok=True)
        conn = self.accept()
        if conn is None:
            return 128 + self.signalled if self.signalled else 0
        reader = conn.makefile("rb")
        try:
            request = json.loads(reader.readline() or b"null")
            proc = self.start(request)
        except (ValueError, TypeError, KeyError, OSError) as e:
            return self.finish(conn, EXIT_CANNOT_START, 0, f"failed cannot start the learner: {e}")
        _say(conn, f"started {proc.pid}")
        if self.stopping:  # the pod's SIGTERM came while it started
            self.signal_group(signal.SIGTERM)
        # not a Loop: blocks reading the hand-off's lines until its end
        threading.Thread(target=self.follow, args=(reader,), daemon=True).start()
        status = None
        while status is None:
            status = self.reap(proc.pid)
            if status is None:
                time.sleep(POLL)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if self.stopping or self.lost:
            while self.group_alive():  # its program may still save a checkpoint; the hand-off's end kills it
                self.reap(-1)
                time.sleep(POLL)
        else:
            self.signal_group(signal.SIGKILL)  # nothing the learner left behind outlives it
        code = proc.returncode
        return self.finish(conn, 128 - code if code < 0 else code, -code if code < 0 else 0)

    def finish(self, conn: socket.socket, code: int, sig: int, message: str = "") -> int:
        self.pgid = None
        (self.dir / EXIT).write_text(f"{code} {sig}\n")
        (self.dir / END).write_text("")
        if message:
            _say(conn, message)
        _say(conn, f"exit {code} {sig}")
        conn.close()
        return code


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m trainforge_frameworks.podwaiter <hand-off dir>", file=sys.stderr)
        return EXIT_USAGE
    return Waiter(Path(argv[1]).absolute()).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))

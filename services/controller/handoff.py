"""The learner's command in the pod's learner container: what a kubernetes controller runs in place of `/bin/sh -c command`.

The controller keeps its whole contract (status under a lease, the halt
protocol, checkpoints, log shipping, outputs) because, to it, this hand-off
*is* the learner: the controller's entrypoint (services/lcm/backends/kubernetes/entry.py) makes it the spec's launcher,
so the controller starts it under its guard (held until the job's gate
opens, when it has one) as `python -m ...handoff [--reason <path>] <hand-off
dir> /bin/sh -c <command>` with the learner's environment. It

- makes the working directory's tree writable for the pod's group (the
  learner runs under another uid in that group; links are not followed);
- connects to the learner container's waiter (frameworks/podwaiter.py) on the hand-off
  directory's socket, waiting for it to listen, and sends the command, the
  environment and the working directory: the go;
- copies the learner's output, which the waiter writes to the hand-off
  directory, to its own stdout and stderr, which the controller archives and
  ships;
- forwards SIGTERM and SIGINT as `signal TERM`/`signal INT` lines; the
  controller's SIGKILL after the grace kills this process, which closes the
  connection, and the waiter then SIGKILLs the learner's group;
- exits as the learner did (dying of the same signal when a signal ended it),
  after the waiter reported it, or with 255 and a reason in `--reason`'s
  file when the learner container ended without reporting.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from trainforge_frameworks.podwaiter import END, POLL, SOCKET, STDERR, STDOUT

EXIT_LOST = 255


class Handoff:
    def __init__(self, directory: Path, command: list[str], reason_path: Path | None):
        self.dir, self.command, self.reason_path = directory, command, reason_path
        self.conn: socket.socket | None = None
        self.pending: int | None = None  # a stop that came before the connection
        self.ended = threading.Event()

    def reason(self, text: str) -> None:
        print(f"[handoff] {text}", file=sys.stderr, flush=True)
        if self.reason_path is not None:
            try:
                self.reason_path.write_text(text + "\n")
            except OSError as e:
                print(f"[handoff] cannot write {self.reason_path}: {e}", file=sys.stderr, flush=True)

    def _forward(self, signum: int, _frame) -> None:
        if self.conn is None:
            self.pending = signum
            return
        try:
            self.conn.sendall(f"signal {signal.Signals(signum).name[3:]}\n".encode())
        except OSError:
            pass  # the waiter is gone: the learner ended already

    def connect(self) -> socket.socket | None:
        """A connection to the waiter, once it listens; None when a stop came first."""
        os.chdir(self.dir)  # a socket's path is at most 107 bytes: connected to by its name here
        while self.pending is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(SOCKET)
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                time.sleep(POLL)  # the learner container is not up yet
        return None

    def _copy(self, name: str, fd: int) -> None:
        """Follow the learner's output file until the learner ended, then copy what is left."""
        path = self.dir / name
        while not path.exists() and not self.ended.is_set():
            time.sleep(POLL)
        try:
            f = open(path, "rb")  # noqa: SIM115 - read for as long as the learner runs
        except OSError:
            return
        with f:
            while True:
                last = self.ended.is_set()
                data = f.read(65536)
                if data:
                    os.write(fd, data)
                elif last:
                    return
                else:
                    time.sleep(POLL)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        cwd = os.getcwd()
        share_with_group(Path(cwd))
        conn = self.connect()
        if conn is None:
            return _die_of(self.pending)
        request = {"argv": self.command, "env": dict(os.environ), "cwd": cwd}
        conn.sendall(json.dumps(request).encode() + b"\n")
        self.conn = conn
        if self.pending is not None:
            self._forward(self.pending, None)
        # not Loops: each follows one output file until the learner ended
        copies = [threading.Thread(target=self._copy, args=(name, fd), daemon=True)
                  for name, fd in ((STDOUT, 1), (STDERR, 2))]
        for t in copies:
            t.start()
        outcome = None
        for raw in conn.makefile("rb"):
            line = raw.decode(errors="replace").strip()
            if line.startswith("failed "):
                self.reason(f"the learner container {line[len('failed '):]}")
            elif line.startswith("exit "):
                outcome = line.split()[1:]
                break
        self.ended.set()
        for t in copies:
            t.join(10)
        conn.close()
        if outcome is None:
            if not (self.dir / END).exists():
                self.reason("the learner container ended without reporting how the learner ended "
                            "(its pod's status says why)")
            return EXIT_LOST
        code, sig = int(outcome[0]), int(outcome[1])
        return _die_of(sig) if sig else code


def share_with_group(top: Path) -> None:
    """The working directory's tree, group-writable: the learner runs as another user of the pod's group."""
    for path in (top, *top.rglob("*")):
        try:
            if path.is_symlink():
                continue
            os.chmod(path, os.stat(path).st_mode | (0o070 if path.is_dir() else 0o060))
        except OSError:
            continue  # not ours to change (the learner's own files from an earlier run)


def _die_of(sig: int) -> int:
    """End killed by `sig`, as the learner was (the controller reads how it ended from our exit)."""
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    return 128 + sig


def main(argv: list[str]) -> int:
    args = argv[1:]
    reason = None
    if len(args) > 1 and args[0] == "--reason":
        reason, args = Path(args[1]), args[2:]
    if len(args) < 2:
        print("usage: python -m trainforge_services.controller.handoff [--reason <file>] "
              "<hand-off dir> <command...>", file=sys.stderr)
        return 2
    return Handoff(Path(args[0]).absolute(), args[1:], reason).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""What a learner's unbuffered writes cost it, by sink: /dev/null, a pipe, a memfd, a tmpfs file, a disk file.

A Python learner prints N lines of ~90 bytes with PYTHONUNBUFFERED=1 (one
write(2) per line, as under the controller) into each sink in turn (order
reversed every round); the harness reads the output the way a controller
would and copies it into a spool file next to the archive:

  null  : /dev/null, nothing to read (the baseline)
  pipe  : a 1 MiB pipe, a reader thread doing os.read of up to 1 MiB and
          pausing 5 ms after a short read (services/controller/spool.py);
          pipe0 / pipe20 pause 0 / 20 ms; splice moves the pipe's pages
          into the spool with os.splice instead of read + write; socket is a
          Unix stream socketpair (1 MiB buffers) read like the pipe;
          pipe64k is the pipe at the kernel's default size (64 KiB)
  memfd : an os.memfd_create file opened O_APPEND as the learner's stdout; a
          reader thread polling every --poll seconds, os.pread at its own
          offset, freeing what it copied with fallocate(PUNCH_HOLE|KEEP_SIZE)
  shm   : a file on /dev/shm, read the same way (no hole punching)
  file  : a file in the spool's directory, read the same way

For each run: the learner's wall seconds (start to exit) and CPU seconds
(user + system from wait4's rusage). Medians over the rounds and the
slowdown of each sink against /dev/null.

With --print the learner prints its lines (print(line): two write(2) per
line under PYTHONUNBUFFERED); a sink named with "+hook" (pipe+hook) runs the
learner with the controller's line-buffering hook first on its PYTHONPATH
(services/controller/linebuf.py: one write(2) per printed line on a pipe;
on the other sinks it changes nothing).

Usage: .venv/bin/python bench/output_sinks.py [-n 200000] [-r 7] [--dir /tmp] [--print]
         [--sinks null,pipe,pipe+hook,pipe64k+hook]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import fcntl
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from trainforge_services.controller.linebuf import HOOK_DIR

FLOOD = ("import sys\nw = sys.stdout.write\npad = 'x' * 76\n"
         "for i in range({n}):\n    w(f'line {{i:07d}} {{pad}}\\n')\n")
FLOOD_PRINT = "pad = 'x' * 76\nfor i in range({n}):\n    print(f'line {{i:07d}} {{pad}}')\n"
SINKS = ("null", "pipe", "memfd", "shm", "file")
# also: pipe0, pipe20 (the pipe reader's pause in ms), splice (os.splice from the pipe into the spool),
# socket (a Unix stream socketpair with 1 MiB buffers, read like the pipe), pipe64k (the default pipe size)
CHUNK = 1024 * 1024
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def punch(fd: int, offset: int, length: int) -> None:
    if _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        raise OSError(ctypes.get_errno(), "fallocate")


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


class PipeReader(threading.Thread):
    """Copies the pipe into the spool (read + write, or splice), pausing `pause` seconds after a short read."""

    def __init__(self, fd: int, spool: int, pause: float, splice: bool):
        super().__init__(daemon=True)
        self.fd, self.spool, self.pause, self.splice, self.copied = fd, spool, pause, splice, 0

    def run(self) -> None:
        while True:
            if self.splice:
                got = os.splice(self.fd, self.spool, CHUNK)
            else:
                chunk = os.read(self.fd, CHUNK)
                got = len(chunk)
                if got:
                    os.write(self.spool, chunk)
            if not got:
                break
            self.copied += got
            if got < CHUNK and self.pause:
                time.sleep(self.pause)
        os.close(self.fd)


class FileReader(threading.Thread):
    """Tails a file the learner writes, at its own offset; frees what it copied when `free`."""

    def __init__(self, fd: int, spool: int, poll: float, free: bool):
        super().__init__(daemon=True)
        self.fd, self.spool, self.poll, self.free = fd, spool, poll, free
        self.copied, self.freed, self.done = 0, 0, threading.Event()

    def run(self) -> None:
        while True:
            final = self.done.is_set()
            chunk = os.pread(self.fd, CHUNK, self.copied)
            if chunk:
                os.write(self.spool, chunk)
                self.copied += len(chunk)
                if self.free:
                    upto = self.copied & ~4095
                    if upto > self.freed:
                        punch(self.fd, self.freed, upto - self.freed)
                        self.freed = upto
                if len(chunk) == CHUNK:
                    continue
            elif final:
                break
            time.sleep(self.poll)
        os.close(self.fd)


def run_one(sink: str, n: int, workdir: Path, poll: float, prints: bool = False,
            hook: bool = False) -> tuple[float, float, int]:
    argv = [sys.executable, "-c", (FLOOD_PRINT if prints else FLOOD).format(n=n)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if hook:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), env.get("PYTHONPATH", "")) if p)
    spool = os.open(workdir / "spool", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    reader: threading.Thread | None = None
    if sink == "null":
        out = os.open(os.devnull, os.O_WRONLY)
    elif sink == "socket":
        theirs, mine = socket.socketpair()
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CHUNK)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CHUNK)
        out = theirs.detach()
        reader = PipeReader(mine.detach(), spool, 0.005, splice=False)
    elif sink.startswith(("pipe", "splice")):
        # pipe (5 ms pause), pipe0 / pipe20 (0 / 20 ms), splice (os.splice into the spool, 5 ms)
        r, out = os.pipe()
        if sink != "pipe64k":
            fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, CHUNK)
        digits = sink.removeprefix("splice").removeprefix("pipe").removesuffix("64k")
        reader = PipeReader(r, spool, (int(digits) if digits else 5) / 1000, splice=sink.startswith("splice"))
    else:
        if sink == "memfd":
            out = os.memfd_create("learner-stdout", os.MFD_CLOEXEC)
        else:
            path = (Path("/dev/shm") if sink == "shm" else workdir) / f"out-{os.getpid()}"
            out = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            path.unlink()
        fcntl.fcntl(out, fcntl.F_SETFL, fcntl.fcntl(out, fcntl.F_GETFL) | os.O_APPEND)
        reader = FileReader(os.dup(out), spool, poll, free=sink == "memfd")
    if reader:
        reader.start()
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=out, stdin=subprocess.DEVNULL, env=env, close_fds=True)
    os.close(out)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if isinstance(reader, FileReader):
        reader.done.set()
    copied = 0
    if reader:
        reader.join(30)
        copied = reader.copied
    os.close(spool)
    if proc.returncode != 0:
        raise RuntimeError(f"{sink}: the learner exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, copied


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("-r", "--rounds", type=int, default=7)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the spool and the 'file' sink go")
    ap.add_argument("--poll", type=float, default=0.02, help="the file readers' poll interval, seconds")
    ap.add_argument("--sinks", default=",".join(SINKS))
    ap.add_argument("--print", dest="prints", action="store_true", help="the learner prints its lines")
    args = ap.parse_args()
    sinks = tuple(args.sinks.split(","))
    print(f"{platform.machine()}, {os.cpu_count()} vCPUs, {platform.python_implementation()} "
          f"{platform.python_version()}, {platform.release()}, {load()}; {args.n:,} unbuffered lines "
          f"({'print' if args.prints else 'sys.stdout.write'}), "
          f"poll {args.poll * 1000:.0f} ms")
    walls: dict[str, list[float]] = {s: [] for s in sinks}
    cpus: dict[str, list[float]] = {s: [] for s in sinks}
    with tempfile.TemporaryDirectory(prefix="tf-sinks-", dir=args.dir) as tmp:
        for r in range(args.rounds):
            for sink in sinks if r % 2 == 0 else sinks[::-1]:
                wall, cpu, copied = run_one(sink.removesuffix("+hook"), args.n, Path(tmp), args.poll,
                                            prints=args.prints, hook=sink.endswith("+hook"))
                if not sink.startswith("null") and copied != args.n * 90:
                    raise RuntimeError(f"{sink}: copied {copied} of {args.n * 90} bytes")
                walls[sink].append(wall)
                cpus[sink].append(cpu)
                print(f"round {r} {sink:<12} {wall:.3f} s wall {cpu:.3f} s CPU", flush=True)
    print(f"medians ({load()}); slowdown against /dev/null, wall (CPU):")
    w0, c0 = statistics.median(walls["null"]), statistics.median(cpus["null"])
    for s in sinks:
        w, c = statistics.median(walls[s]), statistics.median(cpus[s])
        per = ", ".join(f"{x / d - 1:+.0%}" for x, d in zip(walls[s], walls["null"], strict=True))
        print(f"  {s:<12} {w:.3f} s ({c:.3f} s CPU)  {w / w0 - 1:+6.1%} ({c / c0 - 1:+.1%})  per round: {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

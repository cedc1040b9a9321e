"""One learner output pipe: raw chunks to a spool file, lines from the spool into the archive.

A learner that floods its stdout blocks as soon as its pipe is full, so the
thread reading the pipe does no per-line Python work: it moves what the
pipe holds (up to 1 MiB at a time, the pipe enlarged to 1 MiB where the
kernel allows) into a spool file on disk next to the archive with
`os.splice` (the pages go from the pipe to the file inside the kernel; a
spool the kernel will not splice into is copied through memory instead),
pauses until the pipe would be half full at the rate it just saw (at most
`PACE_SECONDS`), and goes back to the pipe. A second thread tails the
spool, splits it into lines (a line longer than `max_line` bytes is split, a
last line without newline is kept) and appends them to the `LogArchive`,
which numbers them, at the lowest CPU priority; both threads run off the
learner's CPUs where the host has spare ones
(services/controller/priority.py). Memory stays at one chunk per thread
whatever the learner writes; disk holds what the archive has not numbered
yet, and the spool is deleted once drained.

Why a pipe and not a file the controller tails: a write(2) into a pipe costs
the learner less than one into a memfd, a tmpfs file or a disk file
(docs/BENCHMARKS.md, "Log flood").
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from pathlib import Path

from .logship import LogArchive
from .priority import background_priority, output_thread, output_thread_done

log = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
PIPE_BYTES = 1024 * 1024
# After a read that did not fill a chunk the reader waits up to this long before the next, so a flood is
# read in few big chunks rather than one wake-up (thread switch, GIL) per write of the learner's. Only
# with the enlarged pipe; a quiet learner's lines are late by this much at most (`reader_pause`).
PACE_SECONDS = 0.005
# The splitter reads the spool in bigger pieces than the pipe gives: fewer
# wake-ups, and one archive call per piece rather than per line.
_SPLIT_READ_BYTES = 1024 * 1024
# `join` waits for a splitter that is still numbering the spool's lines for as long as it makes progress, but
# at most this long in all: at nice 19 on a saturated host a large spool can take minutes, and the lines
# not yet in the archive would be missing from it.
DRAIN_LONGEST = 600.0


def enlarge_pipe(fd: int, size: int = PIPE_BYTES) -> int:
    """Ask for a bigger pipe buffer (refused above /proc/sys/fs/pipe-max-size for unprivileged users);
    the size it has, 0 when unknown."""
    setsz, getsz = getattr(fcntl, "F_SETPIPE_SZ", None), getattr(fcntl, "F_GETPIPE_SZ", None)
    if setsz is None or getsz is None:
        return 0
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, setsz, size)
    try:
        return fcntl.fcntl(fd, getsz)
    except OSError:
        return 0


def reader_pause(got: int, interval: float, pipe_bytes: int, longest: float) -> float:
    """How long the pipe reader waits after a read of `got` bytes that came `interval` seconds after the last.

    At most `longest`; none after a read that filled the chunk (the learner may be waiting on a full
    pipe); otherwise until the pipe would be half full again at the rate just seen, so a writer keeping
    that rate does not fill it while the reader sleeps.
    """
    if got >= pipe_bytes:
        return 0.0
    if got <= 0 or interval <= 0:
        return longest
    return min(longest, (pipe_bytes / 2) * interval / got)


def split_lines(buf: bytes, max_line: int, final: bool) -> tuple[list[bytes], int]:
    """The complete lines at the start of buf (newline dropped) and how many bytes they took.

    As `readline(max_line)`: a piece ends at a newline or after max_line bytes
    (newline included). With `final`, what is left is a last line too.
    """
    out: list[bytes] = []
    pos, n = 0, len(buf)
    while pos < n:
        end = buf.find(b"\n", pos, pos + max_line)
        if end >= 0:
            out.append(buf[pos:end])
            pos = end + 1
        elif n - pos >= max_line:
            out.append(buf[pos:pos + max_line])
            pos += max_line
        elif final:
            out.append(buf[pos:])
            pos = n
        else:
            break
    return out, pos


class SpooledStream:
    """Reads one pipe (`fd`, owned and closed here) into `archive` under `stream` through a spool file."""

    def __init__(self, stream: str, fd: int, archive: LogArchive, spool: Path, max_line: int, *,
                 chunk_bytes: int = CHUNK_BYTES, pace: float = PACE_SECONDS, splice: bool = True):
        self.stream, self.archive, self.spool, self.max_line = stream, archive, Path(spool), max_line
        self.chunk_bytes, self.pace, self.splice = chunk_bytes, pace, splice
        self._fd = fd
        self._wfd = os.open(self.spool, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self._rfd = os.open(self.spool, os.O_RDONLY | os.O_CLOEXEC)
        self._data = threading.Event()
        self._eof = False
        self._warned = False
        self._split_bytes = 0  # spool bytes the splitter has read and numbered: join's sign of progress
        self._full = chunk_bytes
        # not Loops: a byte pump blocked on the learner's pipe, and a splitter that follows it as data comes
        self._reader = threading.Thread(target=self._copy, name=f"learner-{stream}", daemon=True)
        self._splitter = threading.Thread(target=self._split, name=f"learner-{stream}-lines", daemon=True)

    def start(self) -> SpooledStream:
        pipe_bytes = enlarge_pipe(self._fd)
        if pipe_bytes < PIPE_BYTES:
            self.pace = 0.0  # a small pipe fills within the pause: read as soon as there is output
        self._full = min(self.chunk_bytes, pipe_bytes)  # a read of this much may have left the writer waiting
        self._splitter.start()
        self._reader.start()
        return self

    def _copy(self) -> None:
        output_thread()
        splice = self.splice and hasattr(os, "splice")
        last = time.monotonic()
        try:
            while True:
                if splice:
                    try:
                        got = os.splice(self._fd, self._wfd, self.chunk_bytes)
                    except OSError as e:
                        # a spool the kernel cannot splice into (or a write error): copy through memory from
                        # here on, where a write error drops the chunk rather than stalling the pipe
                        log.debug("splicing learner %s into its spool failed (%s); copying instead", self.stream, e)
                        splice = False
                        continue
                else:
                    got = self._read_and_write()
                if not got:
                    return
                self._data.set()
                if self.pace:
                    # the rate: what came since the previous read returned, the pause included
                    now = time.monotonic()
                    time.sleep(reader_pause(got, now - last, self._full, self.pace))
                    last = now
        finally:
            output_thread_done()
            os.close(self._fd)
            os.close(self._wfd)
            self._eof = True
            self._data.set()

    def _read_and_write(self) -> int:
        """One chunk from the pipe to the spool through memory; the bytes read (0 at the pipe's end)."""
        chunk = os.read(self._fd, self.chunk_bytes)
        try:
            view = memoryview(chunk)
            while view:
                view = view[os.write(self._wfd, view):]
        except OSError as e:
            # Keep draining the pipe so the learner never blocks, even when the disk is full.
            if not self._warned:
                log.error("cannot spool learner %s: %s", self.stream, e)
                self._warned = True
        return len(chunk)

    def _split(self) -> None:
        background_priority()  # the reader keeps its priority: a starved reader would fill the pipe
        output_thread()
        warned = False
        pending = b""
        try:
            while True:
                self._data.clear()
                eof = self._eof  # read before the spool: a chunk written before eof is then read below
                chunk = os.read(self._rfd, _SPLIT_READ_BYTES)
                if chunk:
                    pending += chunk
                elif not eof:
                    self._data.wait(1.0)
                    continue
                lines, used = split_lines(pending, self.max_line, final=not chunk)
                pending = pending[used:]
                if lines:
                    try:
                        self.archive.append_many(self.stream, [b.decode("utf-8", errors="replace").rstrip("\r")
                                                               for b in lines])
                    except (OSError, ValueError) as e:
                        if not warned:
                            log.error("cannot append learner %s to the log archive: %s", self.stream, e)
                            warned = True
                self._split_bytes += len(chunk)
                if not chunk:
                    return
        finally:
            output_thread_done()
            os.close(self._rfd)

    def join(self, timeout: float | None, *, longest: float = DRAIN_LONGEST) -> bool:
        """Wait until the pipe reached its end and every line is in the archive; delete the spool then. False
        when the pipe did not end within `timeout` (a process outside the learner's group still holds it), or
        the splitter made no progress for `timeout` seconds, or was still at it after `longest` in all: the
        spool keeps what it has not numbered."""
        self._reader.join(timeout)
        if self._reader.is_alive():
            return False
        if timeout is None:
            self._splitter.join()
        else:
            start = time.monotonic()
            seen, stalled_at = self._split_bytes, start + timeout
            while self._splitter.is_alive():
                now = time.monotonic()
                if self._split_bytes != seen:  # a busy host's background splitter, still numbering lines
                    seen, stalled_at = self._split_bytes, now + timeout
                wait = min(stalled_at, start + longest) - now
                if wait <= 0:
                    return False
                self._splitter.join(min(wait, 0.5))
        with contextlib.suppress(OSError):
            self.spool.unlink()
        return True

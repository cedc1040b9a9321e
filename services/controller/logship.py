"""Learner logs: a local append-only archive first, the search index second.

A learner that writes to a full pipe stops, so the reader threads must never
wait on anything slow. They hand each line to `LogArchive`, which numbers it,
stamps it and appends it as one JSON line to a local file: a write and a
flush, nothing else. `LogShipper` tails that file from its own thread and
sends batches to the log store; while the store is down it retries the same
batch with backoff and reads nothing new, so memory stays at one batch and
no line is lost or sent out of order. The file doubles as the durable
archive uploaded to the object store when the learner ends, from which the
index can be rebuilt. The shape is Determined's `_log_shipper.py` (bounded
batch, deadline, drain on shutdown) with the bounded queue replaced by a
file, so a long log-store outage costs disk, not memory or lines.
"""

from __future__ import annotations

import collections
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from json.encoder import encode_basestring as _quote  # the C encoder, as json.dumps(s, ensure_ascii=False)
from pathlib import Path
from typing import BinaryIO, Protocol

from trainforge_services.common.adapters.logstore import LogLine
from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.contracts import storekeys
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.retry import STEADY, Policy

from .priority import background_priority, output_thread, output_thread_done

log = logging.getLogger(__name__)

STREAMS = ("stdout", "stderr", "system", "metric")
_ARCHIVE_NAME = re.compile(r"^learner-(\d+)-(\d+)\.log\.jsonl$")


class LogSink(Protocol):
    """Where batches go; `write` raises when the batch was not (fully) stored.

    A sink that also has `write_raw(docs)` (a list of (doc id, archive line
    bytes)) is given the archive's lines as they are, saving a decode and an
    encode per line: the archive line already is the index document.
    """

    def write(self, lines: list[LogLine]) -> None: ...


def utc_timestamp() -> str:
    """ISO-8601 UTC with milliseconds, e.g. 2026-01-01T00:00:00.001Z."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _complete_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(0, 2)
        if f.tell() == 0:
            return True
        f.seek(-1, 2)
        return f.read(1) == b"\n"


class LogArchive:
    """The learner's log lines, numbered 1, 2, 3… across streams, in a local JSONL file.

    `append` is safe to call from several threads; it never waits on the
    network. `on_append` is called after each line (the shipper's wake-up).
    With `flush_interval` > 0 lines are flushed to the file at most that
    often (and by `flush()`, which the shipper calls at the end of the file),
    saving a system call per line in a flood; a controller killed outright
    then loses at most that interval's lines, as it loses what is still in
    the pipe.
    """

    def __init__(self, path: Path, *, job: str, team: str, learner: int, attempt: int,
                 on_append: Callable[[], None] | None = None, tail_lines: int = 20, flush_interval: float = 0.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._job, self._team, self._learner, self._attempt = job, team, learner, attempt
        self._on_append = on_append
        self._lock = threading.Lock()
        # A controller run again for the same attempt continues the numbering,
        # so its lines never overwrite the earlier run's in the index.
        self._seq = _complete_lines(self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the archive
        if not _ends_with_newline(self.path):
            self._file.write("\n")  # end a line cut off by a crash; the shipper skips it
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        # Everything but stream, seq, ts and line is the same on every line: encoded once.
        self._head = (f'{{"job": {json.dumps(job)}, "team": {json.dumps(team)}, "learner": {int(learner)}, '
                      f'"attempt": {int(attempt)}, "stream": "')
        self._flush_interval = flush_interval
        self._flushed_at = 0.0
        self._ts_ms, self._ts = -1, ""

    @property
    def lines_written(self) -> int:
        return self._seq

    def append(self, stream: str, text: str) -> LogLine:
        if stream not in STREAMS:
            raise ValueError(f"stream must be one of {', '.join(STREAMS)}, got {stream!r}")
        with self._lock:
            seq, ts = self._seq + 1, self._timestamp()
            self._file.write(f'{self._head}{stream}", "seq": {seq}, "ts": "{ts}", "line": '
                             f'{_quote(text)}}}\n')
            now = time.monotonic()
            if now - self._flushed_at >= self._flush_interval:
                self._file.flush()
                self._flushed_at = now
            # Numbered only once it is written, so a failed write leaves no gap.
            self._seq = seq
            if stream in ("stdout", "stderr"):
                self._tail.append(text)
        if self._on_append is not None:
            self._on_append()
        return LogLine(self._job, self._team, self._learner, self._attempt, stream, seq, ts, text)

    def append_many(self, stream: str, texts: list[str]) -> int:
        """`append` for several lines of one stream at once, under one lock (the spool's splitter); the count."""
        if stream not in STREAMS:
            raise ValueError(f"stream must be one of {', '.join(STREAMS)}, got {stream!r}")
        if not texts:
            return 0
        with self._lock:
            seq, ts, head = self._seq, self._timestamp(), f'{self._head}{stream}", "seq": '
            tail = f', "ts": "{ts}", "line": '
            self._file.write("".join(f"{head}{seq + i}{tail}{_quote(t)}}}\n" for i, t in enumerate(texts, 1)))
            now = time.monotonic()
            if now - self._flushed_at >= self._flush_interval:
                self._file.flush()
                self._flushed_at = now
            self._seq = seq + len(texts)
            if stream in ("stdout", "stderr"):
                self._tail.extend(texts[-(self._tail.maxlen or 0):])
        if self._on_append is not None:
            self._on_append()
        return len(texts)

    def _timestamp(self) -> str:
        """utc_timestamp(), formatted once per millisecond: a flood prints thousands of lines in each."""
        t = time.time()
        ms = int(t * 1000)
        if ms != self._ts_ms:
            self._ts_ms = ms
            self._ts = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return self._ts

    def flush(self) -> None:
        """Hand what `append` buffered to the file (the shipper calls this when it reached the end)."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                self._flushed_at = time.monotonic()

    def tail(self) -> list[str]:
        """The last stdout/stderr lines (not the controller's own system lines)."""
        with self._lock:
            return list(self._tail)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


class LogShipper:
    """Tails a `LogArchive` file and ships it to a `LogSink` in ordered batches.

    A batch is sent when it holds `max_lines` lines or its oldest line has
    waited `max_seconds`. A failed send is retried, same batch, with the
    backoff of its `retry` policy.
    `close(timeout)` ships everything up to the end of the file, then stops.
    """

    def __init__(self, path: Path, sink: LogSink, *, max_lines: int = 500, max_seconds: float = 0.5,
                 retry: Policy = STEADY, poll: float = 0.5,
                 clock: Callable[[], float] = time.monotonic):
        if max_lines < 1 or max_seconds <= 0:
            raise ValueError("max_lines must be >= 1 and max_seconds > 0")
        self.path = Path(path)
        self._sink = sink
        self._max_lines, self._max_seconds = max_lines, max_seconds
        self._backoff = retry.backoff()
        self._poll, self._clock = poll, clock
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._deadline = float("inf")
        # not a Loop: one tail of one file, holding the open file and the unsent batch for its whole life,
        # draining to a deadline on close, on an output thread placed and niced as such (priority.py)
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._drained = False
        # Set to the archive's flush when it buffers lines: called whenever the end of the file is reached.
        self.before_read: Callable[[], None] | None = None
        self.shipped = 0
        self.failures = 0
        self.last_error: str = ""

    def start(self) -> LogShipper:
        self._thread.start()
        return self

    def notify(self) -> None:
        """New lines were appended; never blocks."""
        self._wake.set()

    def close(self, timeout: float) -> bool:
        """Ship the rest of the file within `timeout` seconds; True when all of it arrived."""
        self._deadline = self._clock() + timeout
        self._closing.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, timeout) + 1.0)
        return self._drained and not self._thread.is_alive()

    # -- the shipping thread ----------------------------------------------------

    def _run(self) -> None:
        background_priority()
        output_thread()
        try:
            self._ship_until_closed()
        except Exception:  # noqa: BLE001 - the shipper must not take the controller down
            log.exception("log shipper stopped unexpectedly")
        finally:
            output_thread_done()

    def _open(self) -> BinaryIO | None:
        while True:
            try:
                return open(self.path, "rb")  # noqa: SIM115 - closed in _ship_until_closed
            except FileNotFoundError:
                if self._closing.is_set():
                    return None
                self._wake.wait(self._poll)
                self._wake.clear()

    def _ship_until_closed(self) -> None:
        f = self._open()
        if f is None:
            self._drained = True
            return
        with f:
            pending: list[tuple[LogLine, bytes]] = []
            oldest = 0.0
            while True:
                self._wake.clear()
                # Looked at before reading: close() comes after the last append, so
                # an end of file reached after that is the end of the learner's log.
                closing = self._closing.is_set()
                at_eof = False
                flushed = False
                while len(pending) < self._max_lines:
                    start = f.tell()
                    raw = f.readline()
                    if not raw.endswith(b"\n"):
                        # Nothing new, or a line still being written: read it whole later.
                        f.seek(start)
                        if not flushed and self.before_read is not None:
                            self.before_read()
                            flushed = True
                            continue
                        at_eof = True
                        break
                    line = self._parse(raw)
                    if line is None:
                        continue
                    if not pending:
                        oldest = self._clock()
                    pending.append((line, raw))
                if pending and (len(pending) >= self._max_lines or closing
                                or self._clock() - oldest >= self._max_seconds):
                    if self._send(pending):
                        self.shipped += len(pending)
                        pending = []
                        self._backoff.reset()
                        continue
                    if closing and self._clock() >= self._deadline:
                        log.warning("log shipper gave up at its deadline with unshipped lines: %s", self.last_error)
                        return
                    self._sleep(min(self._backoff.next(), max(0.0, self._deadline - self._clock())))
                    continue
                if closing and at_eof and not pending:
                    self._drained = True
                    return
                wait = self._poll if not pending else max(0.0, oldest + self._max_seconds - self._clock())
                self._wake.wait(wait)

    def _send(self, batch: list[tuple[LogLine, bytes]]) -> bool:
        try:
            write_raw = getattr(self._sink, "write_raw", None)
            if write_raw is not None:
                write_raw([(line.doc_id, raw) for line, raw in batch])
            else:
                self._sink.write([line for line, _ in batch])
            return True
        except Exception as e:  # noqa: BLE001 - any sink failure means "retry the batch"
            self.failures += 1
            if self.failures == 1 or self.last_error != str(e):
                log.warning("log store write of %d lines failed (will retry): %s", len(batch), e)
            self.last_error = str(e)
            return False

    def _sleep(self, seconds: float) -> None:
        if self._closing.is_set():
            time.sleep(seconds)  # the caller keeps this within the deadline
        else:
            self._closing.wait(seconds)  # a close() starts the drain at once

    def _parse(self, raw: bytes) -> LogLine | None:
        try:
            return LogLine(**json.loads(raw))
        except (ValueError, TypeError) as e:
            log.warning("skipping an unreadable archive line (%s): %r", e, raw[:200])
            return None


def upload_earlier_archives(spec: LearnerSpec, store: Callable[[], ObjectStore]) -> list[str]:
    """Upload this rank's archives of earlier attempts that never reached the object store.

    A controller killed outright (SIGKILL, a lost node) uploads nothing; its
    attempt's archive stays beside the attempt's working directory. Backends
    that keep attempts side by side (`<job dir>/<attempt>/learner-<rank>/`,
    the local backend's layout) let the next attempt's controller find and
    upload it, so the killed attempt's lines stay readable, kept apart under
    their own attempt. Best effort: a failure is logged, never raised.
    """
    job_dir = spec.workdir.parent.parent
    done: list[str] = []
    try:
        found = sorted(job_dir.glob(f"*/learner-{spec.rank}-*.log.jsonl"))
    except OSError:
        return done
    for path in found:
        m = _ARCHIVE_NAME.match(path.name)
        if not m or int(m.group(1)) != spec.rank or int(m.group(2)) >= spec.attempt:
            continue
        key = storekeys.log_key(spec.job_id, spec.rank, int(m.group(2)))
        try:
            if store().exists(key):
                continue
            store().put_file(key, path)
            done.append(key)
            log.info("uploaded the log archive %s left by an earlier attempt's controller", key)
        except Exception as e:  # noqa: BLE001 - salvage must never stop this attempt
            log.warning("could not upload the earlier log archive %s: %s", path, e)
    return done

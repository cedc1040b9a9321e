"""The log archive and shipper against in-memory sinks that record, fail or block."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.servers import wait_for
from trainforge_services.common.adapters.logstore import LogLine
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.retry import QUICK
from trainforge_services.controller.logship import LogArchive, LogShipper, utc_timestamp


class RecordingSink:
    def __init__(self):
        self.batches: list[list[LogLine]] = []
        self.times: list[float] = []
        self.lock = threading.Lock()

    def write(self, lines: list[LogLine]) -> None:
        with self.lock:
            self.batches.append(list(lines))
            self.times.append(time.monotonic())

    @property
    def lines(self) -> list[LogLine]:
        with self.lock:
            return [ln for b in self.batches for ln in b]


class FlakySink(RecordingSink):
    """Refuses the first `failures` writes, then every `every`-th one."""

    def __init__(self, failures: int, every: int = 0):
        super().__init__()
        self.failures, self.every, self.calls = failures, every, 0

    def write(self, lines: list[LogLine]) -> None:
        self.calls += 1
        if self.calls <= self.failures or (self.every and self.calls % self.every == 0):
            raise Unavailable("log store down")
        super().write(lines)


class BlockingSink(RecordingSink):
    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, lines: list[LogLine]) -> None:
        self.entered.set()
        self.release.wait(30)
        super().write(lines)


def make(directory, sink, **kw):
    path = directory / "learner-0-1.log.jsonl"
    opts = {"max_lines": 10, "max_seconds": 0.05, "retry": QUICK.starting(0.0025), "poll": 0.05}
    shipper = LogShipper(path, sink, **(opts | kw))
    archive = LogArchive(path, job="j", team="t", learner=0, attempt=1, on_append=shipper.notify)
    return archive, shipper.start()


def test_timestamps_are_utc_milliseconds():
    ts = utc_timestamp()
    assert len(ts) == len("2026-01-01T00:00:00.001Z") and ts.endswith("Z") and ts[19] == "."


def test_archive_numbers_lines_across_streams_and_threads(tmp_path):
    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=2, attempt=3)

    def write(stream):
        for i in range(200):
            archive.append(stream, f"{stream} {i}")

    threads = [threading.Thread(target=write, args=(s,)) for s in ("stdout", "stderr")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    archive.append("system", "done")
    archive.close()
    docs = [json.loads(raw) for raw in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [d["seq"] for d in docs] == list(range(1, 402))
    assert {(d["job"], d["team"], d["learner"], d["attempt"]) for d in docs} == {("j", "t", 2, 3)}
    for stream in ("stdout", "stderr"):
        assert [d["line"] for d in docs if d["stream"] == stream] == [f"{stream} {i}" for i in range(200)]
    assert archive.tail()[-1] != "done" and len(archive.tail()) == 20


def test_archive_reopened_continues_numbering(tmp_path):
    path = tmp_path / "a.jsonl"
    first = LogArchive(path, job="j", team="t", learner=0, attempt=1)
    first.append("stdout", "a")
    first.append("stdout", "b")
    first.close()
    with open(path, "a") as f:
        f.write('{"cut off')  # a crash in the middle of a line
    again = LogArchive(path, job="j", team="t", learner=0, attempt=1)
    assert again.append("stdout", "c").seq == 3
    again.close()


def test_archive_rejects_unknown_streams(tmp_path):
    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    with pytest.raises(ValueError, match="stream must be one of"):
        archive.append("stdin", "x")
    archive.close()


def test_batches_never_exceed_max_lines(tmp_path):
    sink = RecordingSink()
    archive, shipper = make(tmp_path, sink, max_lines=10, max_seconds=30)
    for i in range(25):
        archive.append("stdout", f"line {i}")
    # Full batches go out at once, without waiting for the 30 s deadline.
    wait_for(lambda: len(sink.lines) == 20, 5, "two full batches")
    assert [len(b) for b in sink.batches] == [10, 10]
    archive.close()
    assert shipper.close(5)
    assert [len(b) for b in sink.batches] == [10, 10, 5]
    assert [ln.seq for ln in sink.lines] == list(range(1, 26))


def test_a_partial_batch_is_shipped_at_its_deadline(tmp_path):
    sink = RecordingSink()
    archive, shipper = make(tmp_path, sink, max_lines=100, max_seconds=0.3)
    written = time.monotonic()
    for i in range(3):
        archive.append("stdout", f"line {i}")
    wait_for(lambda: sink.batches, 5, "the deadline batch")
    assert sink.times[0] - written >= 0.3
    assert [ln.line for ln in sink.batches[0]] == ["line 0", "line 1", "line 2"]
    archive.close()
    assert shipper.close(5)


def test_every_line_arrives_once_in_order_after_failures(tmp_path):
    sink = FlakySink(failures=5, every=3)
    archive, shipper = make(tmp_path, sink, max_lines=7)
    for i in range(500):
        archive.append("stderr" if i % 5 == 0 else "stdout", f"line {i}")
    archive.close()
    assert shipper.close(30)
    assert [ln.seq for ln in sink.lines] == list(range(1, 501))
    assert [ln.line for ln in sink.lines] == [f"line {i}" for i in range(500)]
    assert all(len(b) <= 7 for b in sink.batches)
    assert shipper.failures > 5 and shipper.shipped == 500


def test_a_blocked_sink_does_not_block_the_writer(tmp_path):
    sink = BlockingSink()
    archive, shipper = make(tmp_path, sink, max_lines=50)
    archive.append("stdout", "first")
    assert sink.entered.wait(5)
    started = time.monotonic()
    for i in range(20000):
        archive.append("stdout", f"line {i}")
    elapsed = time.monotonic() - started
    assert elapsed < 5, f"the writer took {elapsed:.1f}s while the sink was blocked"
    assert archive.lines_written == 20001 and sink.lines == []
    sink.release.set()
    archive.close()
    assert shipper.close(30)
    assert [ln.seq for ln in sink.lines] == list(range(1, 20002))
    assert max(len(b) for b in sink.batches) <= 50


def test_close_gives_up_at_its_deadline_when_the_store_stays_down(tmp_path):
    sink = FlakySink(failures=10**9)
    archive, shipper = make(tmp_path, sink)
    archive.append("stdout", "lost to the index, kept in the archive")
    archive.close()
    started = time.monotonic()
    assert shipper.close(0.5) is False
    assert time.monotonic() - started < 3
    assert "log store down" in shipper.last_error


def test_close_with_nothing_written(tmp_path):
    sink = RecordingSink()
    archive, shipper = make(tmp_path, sink)
    archive.close()
    assert shipper.close(5) is True
    assert sink.batches == []


def test_lines_appended_just_before_close_are_never_dropped(tmp_path):
    # close() right after the last append races the shipper's read of the file end.
    for i in range(100):
        sink = RecordingSink()
        archive, shipper = make(tmp_path / str(i), sink, max_lines=1000, max_seconds=30)
        for n in range(i % 4 + 1):
            archive.append("stdout", f"last {n}")
        archive.close()
        assert shipper.close(5)
        assert [ln.line for ln in sink.lines] == [f"last {n}" for n in range(i % 4 + 1)], f"round {i}"

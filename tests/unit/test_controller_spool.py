"""The learner's output spool: raw chunks to disk, lines into the archive, nothing lost or reordered."""

from __future__ import annotations

import json
import logging
import os
import threading

import pytest

from trainforge_services.controller.logship import LogArchive
from trainforge_services.controller.spool import (
    PIPE_BYTES,
    SpooledStream,
    enlarge_pipe,
    reader_pause,
    split_lines,
)


def test_split_lines_as_readline_with_a_limit():
    assert split_lines(b"a\nbb\ncc", 10, final=False) == ([b"a", b"bb"], 5)
    assert split_lines(b"a\nbb\ncc", 10, final=True) == ([b"a", b"bb", b"cc"], 7)
    # a line of the limit's length, newline included, is whole; one byte more is split
    assert split_lines(b"abc\n", 4, final=False) == ([b"abc"], 4)
    assert split_lines(b"abcd\n", 4, final=False) == ([b"abcd", b""], 5)
    assert split_lines(b"abcdefghij", 4, final=False) == ([b"abcd", b"efgh"], 8)
    assert split_lines(b"", 4, final=True) == ([], 0)


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "read-write"])
def test_spooled_stream_archives_every_line_in_order_and_deletes_its_spool(tmp_path, splice, caplog):
    caplog.set_level(logging.DEBUG, logger="trainforge_services.controller.spool")
    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    r, w = os.pipe()
    spool = tmp_path / "a.jsonl.stdout.spool"
    stream = SpooledStream("stdout", r, archive, spool, max_line=100, splice=splice).start()
    n = 50_000

    def write() -> None:
        with os.fdopen(w, "wb") as f:
            for i in range(n):
                f.write(f"line {i}\r\n".encode())
            f.write(b"x" * 250 + b"\n" + "caf\u00e9 no newline".encode())

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(30)
    assert stream.join(30)
    archive.close()
    docs = [json.loads(raw) for raw in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [d["line"] for d in docs] == [f"line {i}" for i in range(n)] + [
        "x" * 100, "x" * 100, "x" * 50, "caf\u00e9 no newline"]
    assert [d["seq"] for d in docs] == list(range(1, n + 5))
    assert {d["stream"] for d in docs} == {"stdout"}
    assert archive.lines_written == n + 4 and not spool.exists()
    assert not caplog.records  # with splice: the kernel took every chunk, no fallback to copying


def test_the_pipe_is_enlarged_where_the_kernel_allows():
    r, w = os.pipe()
    try:
        assert enlarge_pipe(r) in (PIPE_BYTES, 64 * 1024, 0)  # 64 KiB: refused (pipe-max-size); 0: not Linux
    finally:
        os.close(r)
        os.close(w)


def test_the_splitter_runs_at_background_priority_and_the_reader_does_not(tmp_path):
    from tests.servers import wait_for
    from trainforge_services.controller.priority import BACKGROUND_NICE

    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    r, w = os.pipe()
    stream = SpooledStream("stdout", r, archive, tmp_path / "a.jsonl.stdout.spool", max_line=100).start()
    try:
        wait_for(lambda: os.getpriority(os.PRIO_PROCESS, stream._splitter.native_id) == BACKGROUND_NICE, 5,
                 "the splitter to lower its priority")
        # a starved reader would let the pipe fill and stall the learner
        assert os.getpriority(os.PRIO_PROCESS, stream._reader.native_id) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        os.close(w)
        assert stream.join(10)
        archive.close()


def test_a_spool_the_kernel_will_not_splice_into_is_copied_through_memory(tmp_path, caplog):
    """splice(2) refuses a target opened for appending (EINVAL): the reader copies instead and loses nothing."""
    caplog.set_level(logging.DEBUG, logger="trainforge_services.controller.spool")
    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    r, w = os.pipe()
    spool = tmp_path / "a.jsonl.stdout.spool"
    stream = SpooledStream("stdout", r, archive, spool, max_line=100)
    os.close(stream._wfd)
    stream._wfd = os.open(spool, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    stream.start()
    with os.fdopen(w, "wb") as f:
        for i in range(20_000):
            f.write(f"line {i}\n".encode())
    assert stream.join(30)
    archive.close()
    docs = [json.loads(raw) for raw in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [d["line"] for d in docs] == [f"line {i}" for i in range(20_000)]
    assert any("copying instead" in r.getMessage() for r in caplog.records)  # the fallback did run


def test_the_reader_pauses_until_the_pipe_would_be_half_full_and_never_after_a_full_read():
    pipe, longest = 1024 * 1024, 0.005
    assert reader_pause(pipe, 0.001, pipe, longest) == 0.0  # the learner may be waiting on a full pipe
    assert reader_pause(100, 0.5, pipe, longest) == longest  # a quiet learner: the longest pause
    assert reader_pause(0, 0.0, pipe, longest) == longest
    # 256 KiB in 1 ms (256 MB/s): half the pipe comes in 2 ms
    assert reader_pause(pipe // 4, 0.001, pipe, longest) == pytest.approx(0.002)
    # 100 KB in 10 ms (10 MB/s): half the pipe would take 52 ms; capped
    assert reader_pause(100_000, 0.010, pipe, longest) == longest


class PacedArchive(LogArchive):
    """A LogArchive whose appends take `pause` seconds each (a background splitter on a saturated host), or
    wait for `gate` forever when one is given (a splitter that stopped making progress)."""

    def __init__(self, *args, pause: float = 0.0, gate: threading.Event | None = None, **kw):
        super().__init__(*args, **kw)
        self.pause, self.gate = pause, gate

    def append_many(self, stream, lines):  # noqa: ANN001, ANN201
        if self.gate is not None:
            self.gate.wait()
        elif self.pause:
            threading.Event().wait(self.pause)
        return super().append_many(stream, lines)


def spooled(tmp_path, archive: LogArchive, mib: int) -> SpooledStream:
    """A stream whose pipe delivered `mib` MiB of 100-byte lines and ended (the learner exited)."""
    r, w = os.pipe()
    stream = SpooledStream("stdout", r, archive, tmp_path / "a.stdout.spool", max_line=1000).start()
    line = b"y" * 99 + b"\n"
    with os.fdopen(w, "wb") as f:
        for _ in range(mib * 1024 * 1024 // len(line)):
            f.write(line)
    return stream


def test_join_waits_for_a_slow_splitter_as_long_as_it_makes_progress(tmp_path):
    # 4 MiB are numbered in 4 or more appends of 0.3 s each: longer than the 0.5 s timeout in all, never
    # 0.5 s without progress, so join waits and every line reaches the archive
    archive = PacedArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1, pause=0.3)
    stream = spooled(tmp_path, archive, 4)
    assert stream.join(0.5)
    archive.close()
    assert archive.lines_written == 4 * 1024 * 1024 // 100
    assert not stream.spool.exists()


def test_join_gives_up_on_a_splitter_that_stopped_and_keeps_the_spool(tmp_path):
    gate = threading.Event()
    archive = PacedArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1, gate=gate)
    stream = spooled(tmp_path, archive, 1)
    try:
        assert not stream.join(0.5)  # no progress for 0.5 s: False, the unnumbered lines still in the spool
        assert stream.spool.exists() and stream.spool.stat().st_size > 0
        assert not stream.join(0.2, longest=0.0)  # and `longest` bounds even a splitter that progresses
    finally:
        gate.set()
    assert stream.join(10)
    archive.close()
    assert archive.lines_written == 1024 * 1024 // 100

"""The learner's output spool: raw chunks to disk, lines into the archive, nothing lost or reordered."""

from __future__ import annotations

import json
import os
import threading

from trainforge_services.controller.logship import LogArchive
from trainforge_services.controller.spool import PIPE_BYTES, SpooledStream, enlarge_pipe, split_lines


def test_split_lines_as_readline_with_a_limit():
    assert split_lines(b"a\nbb\ncc", 10, final=False) == ([b"a", b"bb"], 5)
    assert split_lines(b"a\nbb\ncc", 10, final=True) == ([b"a", b"bb", b"cc"], 7)
    # a line of the limit's length, newline included, is whole; one byte more is split
    assert split_lines(b"abc\n", 4, final=False) == ([b"abc"], 4)
    assert split_lines(b"abcd\n", 4, final=False) == ([b"abcd", b""], 5)
    assert split_lines(b"abcdefghij", 4, final=False) == ([b"abcd", b"efgh"], 8)
    assert split_lines(b"", 4, final=True) == ([], 0)


def test_spooled_stream_archives_every_line_in_order_and_deletes_its_spool(tmp_path):
    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    r, w = os.pipe()
    spool = tmp_path / "a.jsonl.stdout.spool"
    stream = SpooledStream("stdout", r, archive, spool, max_line=100).start()
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

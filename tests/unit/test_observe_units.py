"""The small pure parts of issue 11: metrics records, summaries, progress text, charts, fast log lines."""

from __future__ import annotations

import io
import json

from rich.console import Console

from trainforge.cli_logs import LinePrinter, format_cursor
from trainforge.cli_observe import progress_text, sparkline
from trainforge_services.api.jobmetrics import summarize
from trainforge_services.controller.logship import LogArchive
from trainforge_services.controller.metricstail import MetricsTail, clean_record


def test_a_metrics_record_keeps_the_step_and_finite_numbers_only():
    assert clean_record(b'{"step": 3, "loss": 0.5, "acc": NaN, "name": "x", "ok": true}') == '{"step":3,"loss":0.5}'
    for bad in (b"not json", b"[1]", b'{"loss": 1}', b'{"step": -1}', b'{"step": 1.5}', b'{"step": true}'):
        assert clean_record(bad) is None


def test_the_tail_archives_complete_records_and_waits_for_a_cut_line(tmp_path):
    archive = LogArchive(tmp_path / "m.jsonl", job="j", team="t", learner=0, attempt=1)
    tail = MetricsTail(tmp_path / "metrics.jsonl", archive)
    assert tail.read_new() == 0  # no file yet
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2}\nnoise\n{"step": 2, "lo')
    assert tail.read_new() == 1 and tail.rejected == 1
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('ss": 1}\n')
    assert tail.read_new() == 1
    archive.close()
    docs = [json.loads(ln) for ln in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [(d["stream"], d["seq"], json.loads(d["line"])["step"]) for d in docs] == [("metric", 1, 1), ("metric", 2, 2)]
    assert archive.tail() == []  # metrics are not the learner's last words


def _doc(step, learner=0, attempt=1, **values):
    return {"learner": learner, "attempt": attempt, "line": json.dumps({"step": step, **values})}


def test_summaries_give_series_last_values_and_an_eta():
    docs = [_doc(s, loss=1 / s, ts=1000.0 + s, total_steps=100, epoch=0) for s in range(1, 11)]
    out = summarize(docs)
    assert [p["step"] for p in out["series"]["loss"]] == list(range(1, 11))
    assert out["last"]["loss"]["value"] == 0.1 and "ts" not in out["series"]
    assert out["progress"]["step"] == 10 and out["progress"]["steps_per_second"] == 1.0
    assert out["progress"]["eta_seconds"] == 90.0
    assert set(summarize(docs, {"nothing"})["series"]) == set()


def test_progress_text_and_sparkline():
    assert progress_text({}) == ""
    text = progress_text({"step": 1200, "total_steps": 5000, "epoch": 2, "total_epochs": 10,
                          "steps_per_second": 35.1, "eta_seconds": 108})
    assert text == "step 1,200 of 5,000 (24%), epoch 2 of 10, 35.1 steps/s, ETA 1m48s"
    assert sparkline([0, 1, 2, 3]) == "▁▃▆█" and len(sparkline(list(range(500)), width=40)) == 40
    assert sparkline([]) == "" and sparkline([5, 5]) == "▁▁"


def test_fast_printing_matches_the_plain_format():
    buf = io.StringIO()
    printer = LinePrinter(Console(file=io.StringIO(), force_terminal=False), out=buf, chunk=10)
    printer.print({"learner": 0, "attempt": 1, "stream": "stdout", "line": "a"})
    printer.print({"learner": 1, "attempt": 2, "stream": "stderr", "line": "b"})
    printer.close()
    assert buf.getvalue() == "[0] a\n[1/2] b\n"
    assert format_cursor({"1:1": 5, "0:2": 3, "0:1": 9}) == "0:1=9,0:2=3,1:1=5"

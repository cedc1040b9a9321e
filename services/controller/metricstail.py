"""Training metrics: the learner's metrics file, tailed into an archive of its own.

A learner appends `{"step": n, "<name>": value, ...}` JSON lines to
`<workdir>/.tf-metrics.jsonl` (frameworks/torch/helper.py `report_metrics`,
or any script following the convention in docs/CONTRACTS.md). `MetricsTail`
reads complete new lines every `interval` seconds and appends each valid
record to a second `LogArchive` (stream `metric`, the record as compact JSON
in `line`), which a second `LogShipper` ships to the metrics index
(`<logstore_index>-metrics`, directly or through the job gateway) and which is uploaded to
`store://jobs/<job>/metrics/<rank>-<attempt>.jsonl` when the learner ends:
metrics travel the log's path, numbered on their own so the log's sequence
keeps no gaps. The learner never waits on anything: it writes a local file.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path

from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.contracts import storekeys
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.loop import Loop

from .logship import LogArchive, LogShipper, LogSink

log = logging.getLogger(__name__)

METRICS_FILE = ".tf-metrics.jsonl"
MAX_RECORD_BYTES = 16384


def clean_record(raw: bytes) -> str | None:
    """The record as compact JSON (non-finite values dropped), or None when it is not a metrics record."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    step = doc.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    out: dict[str, float | int] = {"step": step}
    for name, value in doc.items():
        if name == "step" or not isinstance(name, str) or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[name[:128]] = value
    return json.dumps(out, separators=(",", ":"))


class MetricsTail:
    def __init__(self, path: Path, archive: LogArchive, interval: float = 0.5):
        self.path, self._archive = Path(path), archive
        self._offset = 0
        self._loop = Loop("metrics-tail", self._read, interval=interval)
        self.records = 0
        self.rejected = 0

    def start(self) -> MetricsTail:
        self._loop.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Read what the learner wrote last, then stop."""
        if self._loop.stop(timeout):
            try:
                self.read_new()
            except Exception:  # noqa: BLE001 - metrics must never take the controller down
                log.exception("reading the last metrics failed")

    def _read(self) -> None:
        self.read_new()

    def read_new(self) -> int:
        """Archive the complete records written since the last call; returns how many."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return 0
        end = data.rfind(b"\n")
        if end < 0:
            return 0
        self._offset += end + 1
        added = 0
        for raw in data[:end].split(b"\n"):
            record = clean_record(raw) if 0 < len(raw) <= MAX_RECORD_BYTES else None
            if record is None:
                if raw.strip():
                    self.rejected += 1
                    if self.rejected == 1:
                        log.warning("ignoring a line of %s that is not a metrics record: %r", self.path, raw[:200])
                continue
            self._archive.append("metric", record)
            added += 1
        self.records += added
        return added


class MetricsChannel:
    """The metrics file -> archive -> index and object store, for one learner attempt."""

    def __init__(self, spec: LearnerSpec, sink: LogSink, *, flush_interval: float = 0.0):
        self._spec = spec
        self.archive_path = spec.workdir.parent / f"learner-{spec.rank}-{spec.attempt}.metrics.jsonl"
        self._sink = sink
        self._shipper = LogShipper(self.archive_path, self._sink, max_lines=500, max_seconds=1.0)
        self.archive = LogArchive(self.archive_path, job=spec.job_id, team=spec.team, learner=spec.rank,
                                  attempt=spec.attempt, on_append=self._shipper.notify, flush_interval=flush_interval)
        self._shipper.before_read = self.archive.flush
        self._tail = MetricsTail(spec.workdir / METRICS_FILE, self.archive)

    def start(self) -> MetricsChannel:
        self._shipper.start()
        self._tail.start()
        return self

    def finish(self, drain_seconds: float, store: Callable[[], ObjectStore]) -> None:
        """Read the last records, ship what the drain allows, upload the archive; never raises."""
        self._tail.stop()
        self.archive.close()
        try:
            self._shipper.close(drain_seconds)
            if self.archive.lines_written:
                store().put_file(storekeys.metrics_key(self._spec.job_id, self._spec.rank, self._spec.attempt),
                               self.archive_path)
        except Exception as e:  # noqa: BLE001 - metrics are best effort beside the learner's outcome
            log.warning("storing the metrics archive failed: %s", e)
        finally:
            close = getattr(self._sink, "close", None)
            if close is not None:
                close()

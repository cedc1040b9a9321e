"""What the experiment driver reads of a trial's metrics: (progress, objective) points in report order.

Trials report through the learner-side `report_metrics`; the controller
ships the records into the metrics index beside the log index
(services/common/adapters/logstore.py `metrics_store()`), one document per
record with the JSON record as its `line`. Only rank 0's records count (every
rank of a DDP job reports the same step). A record without the objective
carries the last objective seen before it, so a trial that logs its loss and
its epoch in separate records still places on the rungs.

The read that follows a trial's end (`settled`: read once, never again)
takes the records from rank 0's metrics archives in the object store, which
hold every record the trial reported: the index may lag behind them (a
controller's shipper that did not catch up within its drain window on a
loaded machine, a log-store outage). Without archived records (a trial that
never started its learner) the index is read, refreshed first, since the log store
makes new documents searchable only on its refresh interval (1 s by default).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import Protocol

from trainforge_services.common import archives
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.objectstore import ObjectStore


class MetricsReader(Protocol):
    def records(self, job_id: str, team: str, *, settled: bool = False) -> list[dict]:
        """The job's metric records (parsed JSON objects), oldest first; Unavailable when the store is down.
        `settled`: the job's attempt ended, so this read is its last; every record shipped so far counts."""
        ...


def _ordered(docs: Iterable[dict]) -> list[dict]:
    """The metric records of rank-0 documents, attempts in order, each in its own sequence (a resumed trial
    continues where its checkpoint was); a document whose line is not a JSON object is skipped."""
    out: list[tuple[int, int, dict]] = []
    for doc in docs:
        try:
            record = json.loads(doc["line"])
            key = (int(doc.get("attempt", 0)), int(doc.get("seq", 0)))
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(record, dict):
            out.append((*key, record))
    return [r for _, _, r in sorted(out, key=lambda t: (t[0], t[1]))]


def _archived_docs(objects: ObjectStore, job_id: str) -> list[dict]:
    """Rank 0's metrics documents from its archives (every attempt); [] when it has none."""
    docs = []
    for raw in archives.merged_raw(objects, job_id, 0, kind="metrics"):
        try:
            docs.append(json.loads(raw))
        except ValueError:
            continue
    return docs


class LogStoreMetrics:
    """Reads the metrics index of the log store (the same documents GET /v1/jobs/{id}/metrics reads), and a
    settled trial's metrics archives when an object store is given."""

    def __init__(self, url: str, log_index: str, page: int = 5000,
                 objects: Callable[[], ObjectStore] | None = None):
        self._store = LogStore(url, log_index).metrics_store()
        self._page = page
        self._objects = objects

    def records(self, job_id: str, team: str, *, settled: bool = False) -> list[dict]:
        if settled and self._objects is not None and (docs := _archived_docs(self._objects(), job_id)):
            return _ordered(docs)
        if settled:
            self._store.ensure_index()
            self._store.refresh()
        docs: list[dict] = []
        cursor: dict[str, int] = {}
        while True:
            got = self._store.read(job_id, team=team, learner=0, after=cursor, limit=self._page)
            if not got.lines:
                break
            cursor = got.cursor
            docs.extend(got.lines)
        return _ordered(docs)

    def close(self) -> None:
        self._store.close()


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def points(records: Iterable[dict], resource: str, objective: str) -> list[tuple[float, float]]:
    """(progress, objective) for every record that has the resource metric, once an objective was seen."""
    out: list[tuple[float, float]] = []
    last: float | None = None
    for record in records:
        value = _number(record.get(objective))
        if value is not None:
            last = value
        progress = _number(record.get(resource))
        if progress is not None and last is not None:
            out.append((progress, last))
    return out


def last_value(records: Iterable[dict], objective: str) -> float | None:
    """The last value of the objective metric reported."""
    last = None
    for record in records:
        value = _number(record.get(objective))
        if value is not None:
            last = value
    return last

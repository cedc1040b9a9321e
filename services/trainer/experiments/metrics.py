"""What the experiment driver reads of a trial's metrics: (progress, objective) points in report order.

Trials report through the learner-side `report_metrics`; the controller
ships the records into the metrics index beside the log index
(services/common/adapters/logstore.py `metrics_store()`), one document per
record with the JSON record as its `line`. Only rank 0's records count (every
rank of a DDP job reports the same step). A record without the objective
carries the last objective seen before it, so a trial that logs its loss and
its epoch in separate records still places on the rungs.

The log store makes new documents searchable on its refresh interval (1 s
by default), so the read that follows a trial's end (`settled`: read once,
never again) refreshes the metrics index first: the records a controller
shipped just before its final status are then counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Protocol

from trainforge_services.common.adapters.logstore import LogStore


class MetricsReader(Protocol):
    def records(self, job_id: str, team: str, *, settled: bool = False) -> list[dict]:
        """The job's metric records (parsed JSON objects), oldest first; Unavailable when the store is down.
        `settled`: the job's attempt ended, so this read is its last; every record shipped so far counts."""
        ...


class LogStoreMetrics:
    """Reads the metrics index of the log store (the same documents GET /v1/jobs/{id}/metrics reads)."""

    def __init__(self, url: str, log_index: str, page: int = 5000):
        self._store = LogStore(url, log_index).metrics_store()
        self._page = page

    def records(self, job_id: str, team: str, *, settled: bool = False) -> list[dict]:
        if settled:
            self._store.ensure_index()
            self._store.refresh()
        out: list[tuple[int, int, dict]] = []
        cursor: dict[str, int] = {}
        while True:
            got = self._store.read(job_id, team=team, learner=0, after=cursor, limit=self._page)
            if not got.lines:
                break
            cursor = got.cursor
            for doc in got.lines:
                try:
                    record = json.loads(doc["line"])
                except (ValueError, KeyError, TypeError):
                    continue
                if isinstance(record, dict):
                    out.append((int(doc.get("attempt", 0)), int(doc.get("seq", 0)), record))
        # attempts in order, each in its own sequence: a resumed trial continues where its checkpoint was
        return [r for _, _, r in sorted(out, key=lambda t: (t[0], t[1]))]

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

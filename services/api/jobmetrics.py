"""A job's training metrics: series, last values and progress, for GET /v1/jobs/{id}/metrics.

Records travel like log lines (services/controller/metricstail.py): a settled
job's are read from its metrics archives in the object store, a running
job's from the metrics index. Each record is `{"step": n, "<name>": value}`;
`epoch`, `total_steps` and `total_epochs` are progress, the rest are series.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from trainforge_services.api import logarchive
from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.objectstore import ObjectStore

PROGRESS = ("epoch", "total_steps", "total_epochs")
_INTERNAL = {"ts", "step"}


def _records_from_archives(objects: ObjectStore, job_id: str) -> Iterator[dict]:
    for raw in logarchive.merged_raw(objects, job_id, kind="metrics"):
        yield json.loads(raw)


def _records_from_index(store: LogStore, job_id: str, team: str, page: int = 5000) -> Iterator[dict]:
    cursor: dict[str, int] = {}
    while True:
        got = store.read(job_id, team=team, after=cursor, limit=page)
        if not got.lines:
            return
        cursor = got.cursor
        yield from got.lines


def summarize(docs: Iterable[dict], names: set[str] | None = None, *, attempt_latest: bool = True) -> dict:
    """Series per name (points {step, value, ts, learner, attempt}), last values and progress."""
    docs = list(docs)
    latest = max((d["attempt"] for d in docs), default=0) if attempt_latest else None
    series: dict[str, list[dict]] = {}
    progress: dict[str, float | int | None] = {}
    first_ts = last_ts = None
    first_step = last_step = None
    for doc in docs:
        try:
            record = json.loads(doc["line"])
        except (ValueError, KeyError, TypeError):
            continue
        step = record.get("step")
        ts = record.get("ts") or None
        for name, value in record.items():
            if name in _INTERNAL:
                continue
            if name in PROGRESS:
                progress[name] = value
                continue
            if names and name not in names:
                continue
            series.setdefault(name, []).append({"step": step, "value": value, "ts": ts, "learner": doc["learner"],
                                                "attempt": doc["attempt"]})
        if doc["learner"] == 0 and (latest is None or doc["attempt"] == latest) and isinstance(step, int):
            if first_step is None:
                first_step, first_ts = step, ts
            last_step, last_ts = step, ts
    last = {name: points[-1] for name, points in series.items()}
    return {"series": series, "last": last, "progress": _progress(progress, first_step, first_ts, last_step, last_ts)}


def _progress(values: dict, first_step: int | None, first_ts: float | None, last_step: int | None,
              last_ts: float | None) -> dict:
    out: dict = {"step": last_step, "epoch": values.get("epoch"), "total_steps": values.get("total_steps"),
                 "total_epochs": values.get("total_epochs"), "steps_per_second": None, "eta_seconds": None}
    if None not in (first_step, first_ts, last_step, last_ts) and last_ts > first_ts and last_step > first_step:
        rate = (last_step - first_step) / (last_ts - first_ts)
        out["steps_per_second"] = round(rate, 4)
        total = values.get("total_steps")
        if isinstance(total, (int, float)) and total >= last_step:
            out["eta_seconds"] = round((total - last_step) / rate, 1)
    return out


def job_metrics(trainer: TrainerApi, metrics_store: LogStore, objects: ObjectStore, *, team: str, job_id: str,
                names: list[str] | None) -> dict:
    job = trainer.get_job(team, job_id)
    if job["state"] in logarchive.SETTLED and logarchive.archives(objects, job_id, kind="metrics"):
        docs: Iterable[dict] = _records_from_archives(objects, job_id)
        source = "archive"
    else:
        docs, source = _records_from_index(metrics_store, job_id, team), "index"
    wanted = {n for value in names or [] for n in value.split(",") if n}
    out = summarize(docs, wanted or None)
    out.update({"job": job_id, "job_state": job["state"], "source": source})
    return out

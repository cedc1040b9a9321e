"""The Trainer's stored documents <-> values, and nowhere else: how a `JobRecord` is written to and read from
MongoDB (states as ints, models as sub-documents, the history keyed by time), a `Usage` as a sub-document, a
team's quota document (services/trainer/quotas.py), a new job's document, and the accounting a transition
adds (for store.py, store_reads.py and quotas.py)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from trainforge_services.common import egress, states
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.states import JobState
from trainforge_services.trainer.admission import demand
from trainforge_services.trainer.record import GATE_CLOSED, JobRecord, LearnerReport, StatusEvent
from trainforge_services.trainer.resources import Limits, Quota, Usage


def history_key() -> str:
    """Sorts by time; the random tail keeps two entries of the same nanosecond apart."""
    return f"{time.time_ns():020d}{secrets.token_hex(2)}"


def usage_doc(usage: Usage) -> dict:
    """A `Usage` as a sub-document stores it."""
    return {"gpus": usage.gpus, "cpus": usage.cpus, "memory": usage.memory, "learners": usage.learners}


def usage_of(doc: Mapping | None) -> Usage:
    """A stored {gpus, cpus, memory, learners} as a `Usage` (a missing field, or no document, is 0)."""
    doc = doc or {}
    return Usage(int(doc.get("gpus", 0)), float(doc.get("cpus", 0.0)), int(doc.get("memory", 0)),
                 int(doc.get("learners", 0)))


def _limits_doc(limits: Limits) -> dict:
    return {name: getattr(limits, name) for name in ("gpus", "cpus", "memory") if getattr(limits, name) is not None}


def quota_doc(quota: Quota) -> dict:
    """A team's quota as its document stores it: only the limits it sets."""
    doc: dict = {name: getattr(quota, name) for name in ("gpus", "cpus", "memory", "jobs")
                 if getattr(quota, name) is not None}
    if quota.egress is not None:
        doc["egress"] = str(egress.parse(quota.egress))
    if quota.gpus_by_type:
        doc["gpus_by_type"] = dict(quota.gpus_by_type)
    if quota.cohort:
        doc["cohort"] = quota.cohort
    for kind in ("lending_limit", "borrowing_limit"):
        if limits := _limits_doc(getattr(quota, kind)):
            doc[kind] = limits
    return doc


def _limits(doc: Mapping | None) -> Limits:
    doc = doc or {}
    return Limits(gpus=None if doc.get("gpus") is None else int(doc["gpus"]),
                  cpus=None if doc.get("cpus") is None else float(doc["cpus"]),
                  memory=None if doc.get("memory") is None else int(doc["memory"]))


def quota_of(doc: Mapping) -> Quota:
    """A stored quota document as a `Quota` (a missing limit is no limit)."""
    def opt(name: str, kind: type) -> int | float | None:
        return None if doc.get(name) is None else kind(doc[name])

    by_type = {str(k): int(v) for k, v in (doc.get("gpus_by_type") or {}).items()}
    return Quota(gpus=opt("gpus", int), cpus=opt("cpus", float), memory=opt("memory", int),
                 jobs=opt("jobs", int), gpus_by_type=by_type, cohort=str(doc.get("cohort") or ""),
                 lending_limit=_limits(doc.get("lending_limit")), borrowing_limit=_limits(doc.get("borrowing_limit")),
                 egress=opt("egress", str))


# record field -> document key, where they differ
_KEYS = {"id": "_id"}


def doc_key(field: str) -> str:
    return _KEYS.get(field, field)


def doc_value(value: Any) -> Any:
    """A record's value as a document stores it (states as ints, models as sub-documents)."""
    if isinstance(value, JobState):
        return int(value)
    if isinstance(value, Usage):
        return usage_doc(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): doc_value(v) for k, v in value.items()}
    return value


def to_document(fields: Mapping[str, Any]) -> dict:
    """Record fields (by the record's names) as document fields; a name the record lacks is refused."""
    unknown = sorted(set(fields) - set(JobRecord.model_fields))
    if unknown:
        raise ValueError(f"not fields of a job record: {', '.join(unknown)}")
    return {doc_key(name): doc_value(value) for name, value in fields.items()}


def to_record(doc: Mapping | None) -> JobRecord | None:
    if doc is None:
        return None
    history = doc.get("history") or {}
    events = tuple(StatusEvent(from_state=JobState(e["from"]), to_state=JobState(e["to"]),
                               reason=e.get("reason", ""), actor=e.get("actor", ""), ts=float(e.get("ts", 0.0)),
                               borrowed=usage_of(e.get("borrowed")),
                               grown=usage_of(e["grown"]) if e.get("grown") is not None else None)
                   for e in (history[k] for k in sorted(history)))
    learners = {str(rank): LearnerReport(**{"rank": int(rank), **s})
                for rank, s in (doc.get("learners") or {}).items()}
    plain = {k: v for k, v in doc.items() if k not in ("_id", "history", "learners", "resources", "state",
                                                       "borrowed", "grown")
             and k in JobRecord.model_fields and v is not None}
    return JobRecord(id=doc["_id"], state=JobState(doc.get("state", 0)), history=events, learners=learners,
                     resources=usage_of(doc.get("resources")),
                     borrowed=usage_of(doc.get("borrowed")),
                     grown=usage_of(doc.get("grown")), **plain)


def to_records(docs: Iterable[Mapping]) -> list[JobRecord]:
    return [r for r in map(to_record, docs) if r is not None]


def fields_projection(fields: Iterable[str]) -> dict:
    return {doc_key(f): 1 for f in fields}


def _held_seconds(usage: Mapping | None, since: float | None, now: float) -> dict[str, float]:
    """GPU- and CPU-seconds of `usage` (a stored {gpus, cpus, ...}) held from `since` to `now`; {} without a start."""
    if since is None:
        return {}
    held = max(0.0, now - float(since))
    usage = usage or {}
    return {"gpu_seconds": held * float(usage.get("gpus", 0)), "cpu_seconds": held * float(usage.get("cpus", 0.0))}


def seconds_spent(current: Mapping, frm: JobState, to: JobState, now: float) -> dict[str, float]:
    """GPU- and CPU-seconds of the stint that ends when a job leaves the ACTIVE states (its minimum since
    `active_since`, an elastic job's grant since `grown_since`); {} otherwise."""
    if frm not in states.ACTIVE or to in states.ACTIVE or current.get("active_since") is None:
        return {}
    spent = _held_seconds(current.get("resources"), current["active_since"], now)
    for key, value in grown_seconds(current, now).items():
        spent[key] += value
    return spent


def grown_seconds(current: Mapping, now: float) -> dict[str, float]:
    """GPU- and CPU-seconds of what an elastic job was granted beyond its minimum, since the grant."""
    return _held_seconds(current.get("grown"), current.get("grown_since"), now)


def history_event(frm: JobState, to: JobState, reason: str, actor: str, ts: float,
                  borrowed: Usage | None = None, grown: Usage | None = None) -> dict:
    """A history entry; `borrowed`, on the entry that reserves resources, is what that stint borrows;
    `grown`, on a grant's entry (RUNNING to RUNNING), what the attempt holds beyond its minimum from then on."""
    event = {"from": int(frm), "to": int(to), "reason": reason, "actor": actor, "ts": ts}
    if borrowed is not None and borrowed != Usage():
        event["borrowed"] = usage_doc(borrowed)
    if grown is not None:
        event["grown"] = usage_doc(grown)
    return event


# Who an admission at insert is recorded as (the rules' ACTOR, the layer above the store).
ADMITTED_BY = "trainer"


def new_job_document(job_id: str, team: str, manifest: Manifest, *, code_uri: str, submitted_by: str,
                     idempotency_key: str, experiment_id: str, trial: int, admitted: str,
                     gated: bool, now: float | None = None) -> dict[str, Any]:
    """A new job's document: PENDING, or with `admitted` (the QUEUED reason) already admitted, its history
    then holding submitted -> PENDING and PENDING -> QUEUED, in that order; stamped `now` (default: now)."""
    now = time.time() if now is None else now
    history = {history_key(): history_event(JobState.JOB_STATE_UNSPECIFIED, JobState.PENDING, "submitted",
                                            submitted_by or "user", now)}
    if admitted:
        first = next(iter(history))
        second = history_key()
        if second <= first:  # the same nanosecond: keep the admission after the submit
            second = f"{int(first[:20]) + 1:020d}{first[20:]}"
        history[second] = history_event(JobState.PENDING, JobState.QUEUED, admitted, ADMITTED_BY, now)
    doc = {
        "_id": job_id,
        "team": team,
        "name": manifest.name,
        "manifest": manifest.model_dump(mode="json"),
        "code_uri": code_uri,
        "submitted_by": submitted_by,
        "state": int(JobState.QUEUED if admitted else JobState.PENDING),
        "reason": admitted or "submitted",
        "queue_position": 0,
        "attempt": 1,
        "priority": int(manifest.priority),
        "resources": usage_doc(demand(manifest)),
        "max_learners": manifest.max_learners if manifest.elastic else 0,
        "gpu_type": manifest.resources.gpu_type or "",
        "gpu_seconds": 0.0,
        "cpu_seconds": 0.0,
        "learners": {},
        "outputs_uri": "",
        "created_at": now,
        "updated_at": now,
        "changed_at": now,
        "history": history,
    }
    if idempotency_key:
        doc["idempotency_key"] = idempotency_key
    if experiment_id:
        doc["experiment_id"], doc["trial"] = experiment_id, trial
    if gated:
        doc["gate"] = GATE_CLOSED
    return doc

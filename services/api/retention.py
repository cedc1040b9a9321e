"""Per-team retention of logs, metrics and outputs, applied by a periodic sweep.

A team's policy (`retention` collection, one document per team) gives the
days each kind is kept after a job ended: logs (the archives and the index
lines), metrics (archives and the metrics index), outputs (the uploaded
outputs). A kind without days is kept for ever. `sweep` looks at every team
with a policy, finds its ended jobs older than each limit, deletes what is
left of that kind and writes one audit entry per job and kind (actor
`retention`, method `RETENTION`), so the audit log says what went and why.
The API process runs a sweep every `retention_interval` seconds (`start_sweeper`);
`POST /v1/admin/retention/sweep` runs it at once.
"""

from __future__ import annotations

import logging
import time

from pydantic import BaseModel, ConfigDict, Field

from trainforge_services.api.audit import AuditLog
from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.mongo import Database, mapped_as
from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.contracts import storekeys
from trainforge_services.common.errors import TrainforgeError, message_of
from trainforge_services.common.loop import Loop
from trainforge_services.common.states import JobState

log = logging.getLogger(__name__)

COLLECTION = "retention"
DAY = 86400.0
ENDED = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
KINDS = ("logs", "metrics", "outputs")


class RetentionPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    logs_days: float | None = Field(None, gt=0, le=36500, description="days a job's logs are kept after it ended")
    metrics_days: float | None = Field(None, gt=0, le=36500, description="days its metrics are kept")
    outputs_days: float | None = Field(None, gt=0, le=36500, description="days its outputs are kept")


class RetentionStore:
    def __init__(self, db: Database, collection: str = COLLECTION):
        self._docs = db[collection]

    @mapped_as("retention store")
    def get(self, team: str) -> RetentionPolicy:
        doc = self._docs.find_one({"team": team}) or {}
        return RetentionPolicy(**{k: doc.get(k) for k in RetentionPolicy.model_fields})

    @mapped_as("retention store")
    def put(self, team: str, policy: RetentionPolicy, actor: str) -> RetentionPolicy:
        self._docs.replace_one({"team": team}, {"team": team, **policy.model_dump(), "set_by": actor,
                                                "set_at": time.time()}, upsert=True)
        return policy

    @mapped_as("retention store")
    def all(self) -> dict[str, RetentionPolicy]:
        docs = list(self._docs.find({}))
        return {d["team"]: RetentionPolicy(**{k: d.get(k) for k in RetentionPolicy.model_fields}) for d in docs}


def _delete(kind: str, job_id: str, objects: ObjectStore, logs: LogStore, metrics: LogStore) -> int:
    """Objects deleted (and index lines dropped) for one kind of one job."""
    if kind == "outputs":
        return objects.delete_prefix(storekeys.outputs_root(job_id))
    prefix = storekeys.logs_prefix(job_id) if kind == "logs" else storekeys.metrics_prefix(job_id)
    index = logs if kind == "logs" else metrics
    indexed = index.count(job_id)
    if indexed:
        index.delete_job(job_id)
    return objects.delete_prefix(prefix) + indexed


def sweep(trainer: TrainerApi, objects: ObjectStore, logs: LogStore, metrics: LogStore, audit: AuditLog,
          store: RetentionStore, now: float | None = None) -> list[dict]:
    """Apply every team's policy once; returns one record per job and kind that lost something."""
    now = time.time() if now is None else now
    done: list[dict] = []
    for team, policy in store.all().items():
        limits = {kind: getattr(policy, f"{kind}_days") for kind in KINDS}
        if not any(limits.values()):
            continue
        for job in trainer.list_jobs(team, limit=1000, states=ENDED):
            age_days = (now - float(job["updated_at"])) / DAY
            for kind, days in limits.items():
                if days is None or age_days < days:
                    continue
                removed = _delete(kind, job["id"], objects, logs, metrics)
                if not removed:
                    continue
                entry = {"ts": now, "key_id": "", "team": "", "role": "", "via": "retention", "method": "RETENTION",
                         "route": f"retention/{kind}", "path": "", "target": job["id"], "target_team": team,
                         "status": 200, "detail": f"deleted {removed} {kind} items of a job ended {age_days:.1f} "
                                                  f"days ago (policy: {days:g} days)"}
                audit.record(entry)
                done.append({"team": team, "job": job["id"], "kind": kind, "removed": removed})
                log.info("retention: %s", entry["detail"], extra={"job": job["id"], "team": team})
    return done


def start_sweeper(settings, trainer: TrainerApi, objects: ObjectStore, logs: LogStore, audit: AuditLog,  # noqa: ANN001
                  db: Database) -> Loop | None:
    """The API's periodic sweep (settings.retention_interval seconds; 0: none), the first one interval after start;
    a failed pass is logged and the next one retries."""
    interval = getattr(settings, "retention_interval", 0)
    if not interval:
        return None
    store = RetentionStore(db)

    def once() -> None:
        metrics = logs.metrics_store()
        try:
            sweep(trainer, objects, logs, metrics, audit, store)
        except (TrainforgeError, OSError) as e:
            log.warning("retention sweep failed (next pass retries): %s", message_of(e))
        finally:
            metrics.close()

    loop = Loop("retention", once, interval=interval)
    loop.start(at_once=False)  # the first sweep one interval after the API starts
    return loop

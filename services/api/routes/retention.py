"""/v1/admin log upkeep: a team's retention of logs, metrics and outputs, a sweep on demand, and a reindex."""

from __future__ import annotations

import logging
import threading
from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field, StrictBool

from trainforge_services.api import reindex
from trainforge_services.api.deps import (
    AuditDep,
    IdentityDep,
    LogsDep,
    ObjectsDep,
    PlatformAdminDep,
    TrainerDep,
)
from trainforge_services.api.retention import RetentionPolicy, RetentionStore, sweep
from trainforge_services.api.schemas import error_responses

router = APIRouter(prefix="/v1/admin", tags=["admin"], responses=error_responses(400, 401, 403, 422, 429))
TeamName = Annotated[str, Path(description="the team's name", max_length=63)]
_NO_TEAM = error_responses(404, e404="no such team")


def _store(request: Request, identity) -> RetentionStore:  # noqa: ANN001
    store = getattr(request.app.state, "retention", None)
    if store is None:
        store = request.app.state.retention = RetentionStore(identity.db)
    return store


@router.get("/teams/{team}/retention", response_model=RetentionPolicy, responses=_NO_TEAM,
            summary="A team's retention of logs, metrics and outputs")
def get_retention(_: PlatformAdminDep, identity: IdentityDep, request: Request, team: TeamName) -> RetentionPolicy:
    identity.team(team)
    return _store(request, identity).get(team)


@router.put("/teams/{team}/retention", response_model=RetentionPolicy, responses=_NO_TEAM,
            summary="Set a team's retention")
def set_retention(tenant: PlatformAdminDep, identity: IdentityDep, request: Request, team: TeamName,
                  body: RetentionPolicy) -> RetentionPolicy:
    """Days each kind is kept after a job ended (null: for ever); the periodic sweep applies it."""
    identity.team(team)
    return _store(request, identity).put(team, body, tenant.actor)


@router.post("/retention/sweep", summary="Apply every team's retention now")
def run_sweep(_: PlatformAdminDep, identity: IdentityDep, trainer: TrainerDep, objects: ObjectsDep, logs: LogsDep,
              audit: AuditDep, request: Request) -> dict:
    """What was deleted: one record per job and kind; each is also in the audit log (method RETENTION)."""
    metrics = logs.metrics_store()
    try:
        return {"deleted": sweep(trainer, objects, logs, metrics, audit, _store(request, identity))}
    finally:
        metrics.close()


log = logging.getLogger(__name__)


class ReindexIn(BaseModel):
    jobs: list[str] = Field(default_factory=list, max_length=1000, description="job ids to reindex")
    all: StrictBool = Field(False, description="every job with a log archive")


@router.post("/logs/reindex", status_code=202, summary="Rebuild the log search index from the archives")
def start_reindex(_: PlatformAdminDep, objects: ObjectsDep, logs: LogsDep, body: ReindexIn) -> dict:
    """Starts in the background (the log store ingests a few thousand lines a second) and answers at once
    with the jobs it will reindex; a job's search coverage (`trainforge logs JOB -q ...`) shows the progress."""
    jobs = reindex.jobs_with_archives(objects) if body.all else list(dict.fromkeys(body.jobs))

    def run() -> None:
        for job in jobs:
            try:
                done = reindex.reindex_job(objects, logs, job)
                log.info("reindexed %d lines of %s", done.lines, job, extra={"job": job})
            except Exception as e:  # noqa: BLE001 - one job's failure must not stop the others
                log.warning("reindexing %s failed: %s", job, e, extra={"job": job})

    threading.Thread(target=run, name="reindex", daemon=True).start()  # not a Loop: a one-shot background job
    return {"jobs": jobs, "started": True}

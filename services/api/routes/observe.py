"""Watching one job: its training metrics and its event timeline."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from trainforge_services.api.deps import LogsDep, ObjectsDep, TenantDep, TrainerDep
from trainforge_services.api.jobmetrics import job_metrics
from trainforge_services.api.schemas import ErrorResponse, error_responses
from trainforge_services.common.adapters.logstore import LogStore

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(400, 401, 422, 429))

_NOT_FOUND = {404: {"model": ErrorResponse, "description": "no such job in the caller's team"}}
JobId = Annotated[str, Path(description="the job id, e.g. j-1a2b3c4d5e6f", max_length=128)]

# What a state change means on the timeline.
_KIND = {"pending": "submit", "queued": "queue", "deploying": "deploy", "running": "run", "storing": "store",
         "completed": "end", "failed": "end", "cancelled": "cancel", "halting": "halt", "halted": "halt",
         "restarting": "restart"}


def _metrics_store(request: Request, logs: LogStore) -> LogStore:
    store = getattr(request.app.state, "metrics_store", None)
    if store is None:
        store = request.app.state.metrics_store = logs.metrics_store()
    return store


@router.get("/{job_id}/metrics", responses=_NOT_FOUND, summary="A job's training metrics")
def get_metrics(
    tenant: TenantDep, trainer: TrainerDep, logs: LogsDep, objects: ObjectsDep, request: Request, job_id: JobId,
    name: Annotated[list[str] | None, Query(description="only these metrics (repeat or comma-separate)")] = None,
) -> dict:
    """Every series the learners reported with `report_metrics` (points: step, value, ts, learner, attempt),
    the last value of each, and progress (step, epoch, totals, steps/s, ETA when `total_steps` is known)."""
    return job_metrics(trainer, _metrics_store(request, logs), objects, team=tenant.team, job_id=job_id,
                       names=name)


@router.get("/{job_id}/events", responses=_NOT_FOUND, summary="A job's timeline")
def get_events(tenant: TenantDep, trainer: TrainerDep, job_id: JobId) -> dict:
    """State changes in order, each with its kind (submit, queue, deploy, run, restart, halt, end...), the
    reason (queue decisions, deploy failures, restart causes) and the actor; then each learner's last word."""
    job = trainer.get_job(tenant.team, job_id)
    events = [{"time": ev["timestamp"], "kind": _KIND.get(ev["to"], "state"), "from": ev["from"], "to": ev["to"],
               "reason": ev.get("reason") or "", "actor": ev.get("actor") or ""} for ev in job.get("history") or []]
    for ln in job.get("learners") or []:
        if ln.get("message"):
            events.append({"time": None, "kind": "learner", "from": "", "to": ln["state"],
                           "reason": f"learner {ln['rank']} (attempt {ln['attempt']}): {ln['message']}",
                           "actor": f"controller-{ln['rank']}"})
    return {"job": job_id, "state": job["state"], "events": events}

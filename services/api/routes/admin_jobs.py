"""/v1/admin/teams/{team}/jobs: platform admins list and cancel any team's jobs.

The same listing as a team's own (filters, cursor pages), for the team
named in the path; a cancel is recorded in the job's history with the
admin's key as its actor, and in the audit log (a POST) with the team it
concerned as its target team.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from trainforge_services.api.audit import note_target
from trainforge_services.api.deps import IdentityDep, PlatformAdminDep, TrainerDep
from trainforge_services.api.routes.jobs import ChangedSince, JobId, list_page, parse_states
from trainforge_services.api.schemas import ErrorResponse, Job, JobList, error_responses

router = APIRouter(prefix="/v1/admin/teams/{team}/jobs", tags=["admin"],
                   responses=error_responses(400, 401, 403, 422, 429))

TeamName = Annotated[str, Path(description="the team's name", max_length=63)]
_NOT_FOUND = {404: {"model": ErrorResponse, "description": "no such team, or no such job in it"}}


@router.get("", response_model=JobList, responses=_NOT_FOUND, summary="Any team's jobs, newest first")
def list_team_jobs(
    _: PlatformAdminDep, identity: IdentityDep, trainer: TrainerDep, team: TeamName,
    state: Annotated[list[str] | None, Query(description="only jobs in these states")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="most jobs returned")] = 50,
    cursor: Annotated[str | None, Query(max_length=512, description="`next_cursor` of the previous page")] = None,
    name: Annotated[str | None, Query(max_length=63, description="only jobs with this name")] = None,
    since: Annotated[float | dt.datetime | None, Query(description="only jobs created at or after this time")] = None,
    until: Annotated[float | dt.datetime | None, Query(description="only jobs created before this time")] = None,
    changed_since: ChangedSince = None,
) -> dict:
    identity.team(team)
    return list_page(trainer, team, limit=limit, states=parse_states(state), cursor=cursor, name=name,
                     since=since, until=until, changed_since=changed_since)


@router.post("/{job_id}/cancel", response_model=Job,
             responses={**_NOT_FOUND, 409: {"model": ErrorResponse, "description": "the job already ended"}},
             summary="Cancel any team's job")
def cancel_team_job(tenant: PlatformAdminDep, trainer: TrainerDep, team: TeamName, job_id: JobId,
                    request: Request) -> dict:
    note_target(request, job_id, team=team)
    return trainer.cancel_job(team, job_id, actor=f"admin:{tenant.key_id}")

"""A team's jobs over HTTP.

Every route is scoped by the caller's team (TenantDep), and the Trainer
answers another team's job exactly like a missing one, so job ids reveal
nothing across teams.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated

from fastapi import APIRouter, File, Form, Header, Path, Query, Request, Response, UploadFile
from fastapi.responses import StreamingResponse
from pydantic import StringConstraints, TypeAdapter, WithJsonSchema

from trainforge_services.api import paging
from trainforge_services.api.access import unix
from trainforge_services.api.audit import note_target
from trainforge_services.api.deps import (
    LogsDep,
    ObjectsDep,
    SettingsDep,
    TenantDep,
    TrainerDep,
    WebhookPolicyDep,
)
from trainforge_services.api.jobcache import CachingTrainer
from trainforge_services.api.logs import raw_archive, read_job_logs, stream_job_logs
from trainforge_services.api.schemas import ErrorResponse, Job, JobList, LogPage, error_responses
from trainforge_services.api.submit import submit_job
from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.common.contracts import ids
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.states import JobState, job_state

router = APIRouter(
    prefix="/v1/jobs",
    tags=["jobs"],
    responses=error_responses(400, 401, 422, 429),
)

_NOT_FOUND = {404: {"model": ErrorResponse, "description": "no such job in the caller's team"}}
# OpenAPI links: what a client (and the schemathesis stateful test) can do next with the job in a response.
_JOB_OPS = {"GetJob": "get_job_v1_jobs__job_id__get", "GetLogs": "get_logs_v1_jobs__job_id__logs_get",
            "HaltJob": "halt_job_v1_jobs__job_id__halt_post", "ResumeJob": "resume_job_v1_jobs__job_id__resume_post",
            "CancelJob": "cancel_job_v1_jobs__job_id__cancel_post"}
JOB_LINKS = {"links": {name: {"operationId": op, "parameters": {"job_id": "$response.body#/id"}}
                       for name, op in _JOB_OPS.items()}}
JobId = Annotated[str, Path(description=f"the job id, e.g. j-1a2b3c4d5e6f: {ids.RULE}", max_length=ids.MAX_LEN,
                            pattern=ids.PATTERN)]
# The states a list may ask for, as the schema enumerates them: names in any case, comma-separated
# (JSON Schema patterns have no case-insensitive flag, hence [rR][uU]...).
_STATE_NAMES = "|".join("".join(f"[{c}{c.upper()}]" if c.isalpha() else c for c in s.name.lower())
                        for s in JobState if s.value)
STATES_PATTERN = rf"^({_STATE_NAMES})(,({_STATE_NAMES}))*$"
# Checked by parse_states (not pydantic), so a bad value's error names the field `state` and lists the states.
StateFilter = Annotated[str, WithJsonSchema({"type": "string", "pattern": STATES_PATTERN, "maxLength": 400})]
# A file part, never a plain form field (which the server refuses): OpenAPI's binary string.
CODE_SCHEMA = {"type": "string", "format": "binary", "description": "the job's code folder as a .tar.gz archive, "
               "sent as a file part"}
# Unix seconds only (an `as_of` is passed back as it came); pydantic refuses a negative, nan or inf value with a
# 422 that names the parameter.
ChangedSince = Annotated[float | None, Query(
    ge=0, allow_inf_nan=False,
    description="only jobs changed (submitted, moved to another state, or given fields) at or after this time, in "
                "unix seconds: pass the `as_of` of the previous listing. Queue notes (a waiting job's reason and "
                "position) are not changes here; a job may come back twice, none is missed")]
LabelFilter = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}=[^=,]{0,63}$")]


def parse_states(values: list[str] | None) -> list[JobState]:
    out: list[JobState] = []
    for value in values or []:
        if len(value) > 400 or not re.fullmatch(STATES_PATTERN, value):
            valid = ", ".join(s.name.lower() for s in JobState if s.value)
            raise InvalidArgument(f"state: {value[:60]!r} is not a comma-separated list of job states; valid: {valid}",
                                  details=[{"field": "state", "message": f"use one or more of {valid}"}])
        for name in value.split(","):
            try:
                state = job_state(name)
            except ValueError as e:
                raise InvalidArgument(str(e), details=[{"field": "state", "message": str(e)}]) from None
            if state == JobState.JOB_STATE_UNSPECIFIED:
                raise InvalidArgument("state: unspecified is not a job state",
                                      details=[{"field": "state", "message": "not a job state"}])
            out.append(state)
    return out


@router.post(
    "", status_code=201, response_model=Job, summary="Submit a job",
    responses={201: JOB_LINKS,
               200: {"model": Job, "description": "an earlier request with this Idempotency-Key created the job",
                     **JOB_LINKS},
               409: {"model": ErrorResponse, "description": "Idempotency-Key reused with another manifest"},
               413: {"model": ErrorResponse, "description": "code archive larger than the limit"}},
)
def submit(
    tenant: TenantDep, settings: SettingsDep, trainer: TrainerDep, objects: ObjectsDep, request: Request,
    response: Response, webhooks: WebhookPolicyDep,
    manifest: Annotated[str, Form(description="the job manifest, YAML or JSON text")],
    code: Annotated[UploadFile | None, File(description="the job's code folder as a .tar.gz archive"),
                    WithJsonSchema(CODE_SCHEMA)] = None,
    idempotency_key: Annotated[str | None, Header(
        description="retries with the same key return the job the first request created")] = None,
) -> dict:
    """Validate the manifest (every problem is listed, each naming its field), store the code archive
    at `store://jobs/<id>/code.tar.gz` and hand the job to the Trainer, which queues it."""
    result = submit_job(trainer, objects, tenant, manifest_text=manifest,
                        code=code.file if code is not None else None,
                        code_size=code.size if code is not None else None,
                        max_upload_bytes=settings.max_upload_bytes, idempotency_key=idempotency_key,
                        webhooks=webhooks)
    note_target(request, result.job["id"])
    if not result.created:
        response.status_code = 200
    return result.job


@router.get("", response_model=JobList, summary="List the team's jobs, newest first")
def list_jobs(
    tenant: TenantDep, trainer: TrainerDep,
    state: Annotated[list[StateFilter] | None, Query(
        description="only jobs in these states (repeat or comma-separate), e.g. running,queued", max_length=16)] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="most jobs returned")] = 50,
    label: Annotated[list[LabelFilter] | None, Query(
        description="only jobs whose manifest has this label, as key=value (repeat: all must match)",
        max_length=16)] = None,
    cursor: Annotated[str | None, Query(max_length=512, description="`next_cursor` of the previous page")] = None,
    name: Annotated[str | None, Query(max_length=63, description="only jobs with this name")] = None,
    since: Annotated[float | dt.datetime | None, Query(
        description="only jobs created at or after this time: ISO-8601 (UTC when no offset) or unix seconds")] = None,
    until: Annotated[float | dt.datetime | None, Query(description="only jobs created before this time")] = None,
    changed_since: ChangedSince = None,
) -> dict:
    """Pages of at most `limit` jobs; `next_cursor` is null on the last page. With `changed_since`, only
    the jobs changed since then: a client following many jobs passes the `as_of` of its previous listing
    (of its first page, when it read several) and reads only what changed instead of every job again."""
    wanted = parse_labels(label)
    if not wanted:
        return list_page(trainer, tenant.team, limit=limit, states=parse_states(state), cursor=cursor, name=name,
                         since=since, until=until, changed_since=changed_since)
    # Labels live in the manifest, which the Trainer does not index: filter the next LABEL_SCAN jobs
    # after the cursor, and continue after the last one returned.
    page = list_page(trainer, tenant.team, limit=LABEL_SCAN, states=parse_states(state), cursor=cursor,
                     name=name, since=since, until=until, changed_since=changed_since)
    jobs = [j for j in page["jobs"] if wanted.items() <= (j.get("manifest") or {}).get("labels", {}).items()]
    if len(jobs) > limit:
        return {"jobs": jobs[:limit], "next_cursor": paging.encode(*paging.job_key(jobs[limit - 1])),
                "as_of": page["as_of"]}
    return {"jobs": jobs, "next_cursor": page["next_cursor"], "as_of": page["as_of"]}


# How many jobs one label-filtered page looks at.
LABEL_SCAN = 1000


def parse_labels(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or []:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"label: {value!r} is not key=value",
                                  details=[{"field": "label", "message": "must be key=value"}])
        out[key] = val
    return out


def list_page(trainer: TrainerApi, team: str, *, limit: int, states: list[JobState], cursor: str | None,
              name: str | None, since: dt.datetime | float | None, until: dt.datetime | float | None,
              changed_since: float | None = None) -> dict:
    """One page of a team's jobs (also the admin's listing of any team), with the Trainer's `as_of`."""
    before = paging.decode(cursor)
    after_ts, before_ts = unix(since, "since") or 0.0, unix(until, "until") or 0.0
    as_of: list[float] = []

    def fetch(n: int) -> list[dict]:
        jobs, taken = trainer.list_jobs_as_of(team, changed_after=changed_since or 0.0, limit=n, states=states,
                                              name=name or "", created_after=after_ts, created_before=before_ts,
                                              before=before)
        as_of.append(taken)
        return jobs

    jobs, next_cursor = paging.page(fetch, limit, paging.job_key)
    return {"jobs": jobs, "next_cursor": next_cursor, "as_of": as_of[0]}


_JOB = TypeAdapter(Job)


def render_job(job: dict) -> bytes:
    """A job as GET /v1/jobs/{id}'s body: what FastAPI makes of the route's `response_model`."""
    return _JOB.dump_json(_JOB.validate_python(job), by_alias=True)


@router.get("/{job_id}", response_model=Job, responses=_NOT_FOUND, summary="One job")
def get_job(tenant: TenantDep, trainer: TrainerDep, job_id: JobId) -> dict | Response:
    """State, reason, queue position, learners and the status history of one job. Each API server may
    answer from its own read of the job made at most `TF_JOB_CACHE_SECONDS` ago (default 0.5 s, at most 1 s);
    a submit, cancel, halt or resume through the same server is read back at once."""
    if isinstance(trainer, CachingTrainer):  # the body rendered once per cached read (services/api/jobcache.py)
        return Response(trainer.get_job_json(tenant.team, job_id), media_type="application/json")
    return trainer.get_job(tenant.team, job_id)


@router.get("/{job_id}/logs", response_model=LogPage, responses=_NOT_FOUND, summary="A page of a job's log lines")
def get_logs(
    tenant: TenantDep, trainer: TrainerDep, logs: LogsDep, objects: ObjectsDep, settings: SettingsDep, job_id: JobId,
    learner: Annotated[int | None, Query(ge=0, description="only this learner's lines")] = None,
    after: Annotated[str | None, Query(description="the `next` cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=10000, description="most lines returned (capped by the server)")] = 1000,
    q: Annotated[str | None, Query(description="full-text search in the lines")] = None,
) -> dict:
    """Lines in order (time, learner, sequence), also after the job ended. Pass `next` back as `after`
    to get the lines that follow; a line shipped late by one learner is still returned. A settled job's
    lines come from its log archives (`source: archive`), all of them whatever the index caught up with;
    a search (`q`) goes to the index and its first page says how much of the log the index holds."""
    return read_job_logs(trainer, logs, team=tenant.team, job_id=job_id, learner=learner, after=after,
                         limit=min(limit, settings.log_page_max), query=q, objects=objects)


@router.get("/{job_id}/logs/stream", responses={**_NOT_FOUND, 200: {"content": {"application/x-ndjson": {}}}},
            response_class=StreamingResponse, summary="Every log line of a job, streamed as JSON lines")
def stream_logs(
    tenant: TenantDep, trainer: TrainerDep, logs: LogsDep, objects: ObjectsDep, settings: SettingsDep,
    job_id: JobId, learner: Annotated[int | None, Query(ge=0, description="only this learner's lines")] = None,
) -> StreamingResponse:
    """One JSON line per log line, in order: a settled job's from its archives (complete), a running
    job's from the index as far as it goes. The `X-Job-State` header is the job's state."""
    state, body = stream_job_logs(trainer, logs, objects, team=tenant.team, job_id=job_id, learner=learner,
                                  page_size=settings.log_page_max)
    return StreamingResponse(body, media_type="application/x-ndjson", headers={"X-Job-State": state})


@router.get("/{job_id}/logs/raw", responses={**_NOT_FOUND, 200: {"content": {"application/x-ndjson": {}}}},
            response_class=StreamingResponse, summary="One learner's raw log archive")
def raw_logs(
    tenant: TenantDep, trainer: TrainerDep, objects: ObjectsDep, job_id: JobId,
    learner: Annotated[int, Query(ge=0, description="the learner (rank)")] = 0,
    attempt: Annotated[int | None, Query(ge=0, description="the attempt; the latest when left out")] = None,
) -> StreamingResponse:
    """The archive the learner's controller uploaded when it ended, byte for byte (one JSON document per
    line: job, team, learner, attempt, stream, seq, ts, line)."""
    name, body = raw_archive(trainer, objects, team=tenant.team, job_id=job_id, learner=learner, attempt=attempt)
    return StreamingResponse(body, media_type="application/x-ndjson",
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.post("/{job_id}/halt", response_model=Job,
             responses={200: JOB_LINKS, **_NOT_FOUND, 409: {"model": ErrorResponse,
                                           "description": "the job is not deploying or running"}},
             summary="Halt a job: checkpoint every learner, stop, free the quota")
def halt_job(tenant: TenantDep, trainer: TrainerDep, job_id: JobId) -> dict:
    """The job goes to halting, then halted once every learner's checkpoint is stored; halting a halting or
    halted job is a no-op. Resume it with POST /v1/jobs/{id}/resume."""
    return trainer.halt_job(tenant.team, job_id, actor=tenant.actor)


@router.post("/{job_id}/resume", response_model=Job,
             responses={200: JOB_LINKS, **_NOT_FOUND, 409: {"model": ErrorResponse, "description": "the job is not halted"}},
             summary="Resume a halted job from its checkpoint")
def resume_job(tenant: TenantDep, trainer: TrainerDep, job_id: JobId) -> dict:
    """The job goes through the queue again as its next attempt; its learners restore the last checkpoint
    before they start. Resuming a job that was already resumed is a no-op."""
    return trainer.resume_job(tenant.team, job_id, actor=tenant.actor)


@router.post("/{job_id}/cancel", response_model=Job,
             responses={**_NOT_FOUND, 409: {"model": ErrorResponse, "description": "the job already ended"}},
             summary="Cancel a job")
def cancel_job(tenant: TenantDep, trainer: TrainerDep, job_id: JobId) -> dict:
    """Move the job to cancelled and stop its learners; cancelling a cancelled job is a no-op."""
    return trainer.cancel_job(tenant.team, job_id, actor=tenant.actor)

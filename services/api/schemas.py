"""The REST shapes of jobs, their logs and health, and the error body every route answers.

Pydantic models, so /docs shows them and responses are checked against them.
Teams, keys, publications and the audit log are in `schemas_teams.py`; quotas,
usage and sizes in `schemas_quota.py`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ErrorDetail(BaseModel):
    field: str = Field(description="dotted path of the offending field, e.g. resources.memory")
    message: str


class ErrorBody(BaseModel):
    code: str = Field(description="machine-readable error code, e.g. not_found, invalid_argument")
    message: str = Field(description="one human-readable sentence")
    details: list[ErrorDetail] = Field(default_factory=list)


class ErrorResponse(BaseModel):
    error: ErrorBody


class Learner(BaseModel):
    rank: int
    state: str = Field(description="preparing, running, storing, completed, failed, halting, halted")
    exit_code: int | None = Field(description="set once the learner process exited")
    attempt: int
    message: str
    isolation: str = Field("", description='what the learner runs in: "sandbox" (its own filesystem view, user, '
                                           'network and limits), "userns" (the same without root: no cgroup '
                                           'limits), "container" (the docker backend) or "none"; '
                                           'empty before it started')
    warning: str = Field("", description='with isolation "none": that the learner is NOT isolated and what it '
                                         'can reach (the platform\'s credentials, files, servers, processes)')


class Borrowed(BaseModel):
    gpus: int
    cpus: float
    memory: int = Field(description="bytes")


class HistoryEvent(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: str = Field(alias="from", description="state before the transition")
    to: str = Field(description="state after the transition")
    reason: str
    actor: str = Field(description='who caused it: "user:<key id>", "trainer", "monitor", "lcm"')
    timestamp: float = Field(description="unix time, seconds")
    borrowed: Borrowed | None = Field(None, description="on the entry that reserved the job's resources: what "
                                      "that stint holds on quota borrowed in its team's cohort; null: nothing")
    grown: Borrowed | None = Field(None, description="on a grant to an elastic job (running to running): "
                                   "everything its attempt holds beyond its minimum from then on; null otherwise")


class JobBorrowed(BaseModel):
    cohort: str
    gpus: int
    cpus: float
    memory: int = Field(description="bytes")


class WorldSize(BaseModel):
    current: int = Field(description="learners running now")
    target: int = Field(description="learners the platform runs or is starting for the job (what fits, "
                                    "at most max)")
    min: int = Field(description="the manifest's learners.min")
    max: int = Field(description="the manifest's learners.max")


class Job(BaseModel):
    id: str
    team: str
    name: str
    state: str = Field(description="pending, queued, deploying, running, storing, completed, failed, "
                                   "cancelled, halting, halted, restarting")
    reason: str = Field(description="why the job is in this state (queue reason, failure reason)")
    queue_position: int = Field(description="1-based position in the team's queue; 0 when not queued")
    attempt: int
    created_at: float
    updated_at: float
    learners: list[Learner]
    history: list[HistoryEvent]
    manifest: dict[str, Any] = Field(description="the validated, normalised manifest")
    outputs_uri: str = Field(description="store://jobs/<id>/outputs/ once outputs are stored")
    submitted_by: str = Field("", description="id of the API key that submitted the job")
    restarts: int = Field(0, description="redeploys after a failure so far (at most restart.max_restarts)")
    checkpoint_step: int | None = Field(None, description="step of the checkpoint stored at the last halt")
    not_before: float = Field(0.0, description="unix time before which a restarting job is not redeployed; 0: none")
    borrowed: JobBorrowed | None = Field(None, description="quota it holds beyond its team's own, borrowed in "
                                                           "its cohort; null: none")
    preemptions: int = Field(0, description="times the scheduler halted it for another job")
    preempted: str = Field("", description="why the scheduler halted it, until it runs again; empty otherwise")
    world_size: WorldSize | None = Field(None, description="an elastic job's size now; null for a fixed-size job")


class JobList(BaseModel):
    jobs: list[Job]
    next_cursor: str | None = Field(None, description="pass back as `cursor` for the next page; null: no more")
    as_of: float | None = Field(None, description="unix seconds: pass back as `changed_since` to list only what "
                                "changed since this listing (of several pages, the first page's)")


class LogLine(BaseModel):
    job: str
    team: str
    learner: int
    attempt: int
    stream: str = Field(description="stdout, stderr or system")
    seq: int = Field(description="1-based, without gaps, per (learner, attempt)")
    ts: str = Field(description="ISO-8601 UTC")
    line: str


class LogPage(BaseModel):
    lines: list[LogLine]
    next: str = Field(description="cursor to pass as `after` for the lines that follow")
    job_state: str = Field(description="the job's state when the page was read")
    source: str = Field("index", description='"archive" (a settled job: every line) or "index" (the search index)')
    indexed: int | None = Field(None, description="searches only: lines of the job the index holds")
    total: int | None = Field(None, description="searches only: lines in the job's archives (settled jobs)")
    coverage: str = Field("", description='searches only: e.g. "index holds 42,000 of 200,001 lines"')


class ComponentHealth(BaseModel):
    status: str = Field(description='"ok" or "unavailable"')
    detail: str = ""


class Health(BaseModel):
    status: str = Field(description='"ok" when every component is')
    components: dict[str, ComponentHealth]


# -- errors every authenticated route can answer ---------------------------------------------

_ERROR_DESCRIPTIONS = {
    400: "the request body could not be read (e.g. malformed multipart data)",
    401: "missing, malformed, unknown, revoked or expired API key or token, or the key's team is disabled",
    403: "the caller's role does not allow this",
    404: "no such resource in the caller's team",
    409: "the target's state forbids this",
    422: "invalid input; every bad field is listed",
    429: "too many requests for this API key; retry after `Retry-After` seconds",
}


def error_responses(*codes: int, **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses, each with the error body."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"model": ErrorResponse,
                                 "description": descriptions.get(f"e{code}", _ERROR_DESCRIPTIONS[code])}
        if code == 429:
            entry["headers"] = {"Retry-After": {"description": "seconds until the key may try again",
                                                "schema": {"type": "integer"}}}
        if code == 401:
            entry["headers"] = {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}}
        out[code] = entry
    return out


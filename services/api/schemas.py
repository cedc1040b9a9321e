"""The REST shapes, as pydantic models so /docs shows them and responses are checked against them."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StringConstraints,
    WithJsonSchema,
    field_validator,
)

from trainforge_services.api.usage import UsageReport
from trainforge_services.common import egress


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


# -- identity ------------------------------------------------------------------------------------

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
ROLE_DESCRIPTION = "member, team_admin or platform_admin"
_SIZE = r"^\s*(\d{1,20}(?:\.\d{1,9})?)\s*([kKmMgGtTpP]i?)?[bB]?\s*$"
_SIZE_MAX_LENGTH = 40


def _digits(n: int, units: str) -> str:
    return rf"\d{{1,{n}}}(\.\d{{1,9}})?\s*{units}[bB]?"


# What the schema promises and the server checks first: a size whose value always fits in int64, so
# every string the schema allows is accepted (fewer integer digits for the larger units).
SIZE_PATTERN = r"^\s*(" + "|".join((_digits(18, ""), _digits(15, "[kK]i?"), _digits(12, "[mM]i?"),
                                      _digits(9, "[gG]i?"), _digits(6, "[tT]i?"), _digits(3, "[pP]i?"))) + r")\s*$"
_SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15,
               "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}


class Whoami(BaseModel):
    team: str
    key_id: str = Field(description="the API key's id (a token's `sub`)")
    role: str = Field(description=ROLE_DESCRIPTION)
    via: str = Field(description='"key" for an API key, "jwt" for a token')


class Token(BaseModel):
    token: str = Field(description="a JWT; send it as `Authorization: Bearer <token>`")
    token_type: str = Field("bearer")
    expires_at: float = Field(description="unix time, seconds; never later than the key's own expiry")
    expires_in: int = Field(description="seconds from now")


class Team(BaseModel):
    name: str
    created_at: float
    disabled: bool = Field(description="a disabled team's keys and tokens are answered 401")
    disabled_at: float | None


class TeamList(BaseModel):
    teams: list[Team]


class TeamIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", max_length=63,
                      description="1-63 lowercase letters, digits or '-'", examples=["ml-research"])


class ApiKey(BaseModel):
    key_id: str = Field(description="public id of the key (its lookup prefix)")
    team: str
    name: str = Field(description="whose or what the key is")
    role: str = Field(description=ROLE_DESCRIPTION)
    created_at: float
    created_by: str = Field(description="id of the key that issued it; empty when issued from the shell")
    last_used_at: float | None = Field(description="unix time of the last use, to about a minute")
    expires_at: float | None
    revoked: bool
    revoked_at: float | None


class IssuedKey(ApiKey):
    key: str = Field(description="the key itself; shown only in this response, never again")


class KeyList(BaseModel):
    keys: list[ApiKey]


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$",
                      description="whose or what the key is, e.g. alice or ci", examples=["ci"])
    role: Literal["member", "team_admin", "platform_admin"] = Field(
        "member", description="no higher than the caller's own role")
    expires_at: dt.datetime | None = Field(
        None, description="ISO-8601 (UTC when no offset); must be in the future (a past time is answered 422 "
                          "naming expires_at); none: never expires")

# -- quotas and usage ------------------------------------------------------------------------------

GpuType = Annotated[str, StringConstraints(pattern=r"^[a-z0-9-]{1,32}$")]


def parse_size(value: object) -> int | None:
    """Bytes from a number of bytes or a size such as 8Gi or 512M; 0 is allowed (no memory at all)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("must be a number of bytes or a size such as 8Gi")
    if isinstance(value, int):
        n = value
    else:
        fits = len(value) <= _SIZE_MAX_LENGTH and re.match(SIZE_PATTERN, value)
        m = re.match(_SIZE, value) if fits else None
        if not m:
            raise ValueError(f"{value[:40]!r} is not a size; use e.g. 512Mi, 8Gi or a number of bytes")
        n = int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()])
    if n < 0:
        raise ValueError("must be >= 0 (leave it out for no limit)")
    if n > INT64_MAX:
        raise ValueError(f"must be at most {INT64_MAX} bytes")
    return n


Size = Annotated[int | None, BeforeValidator(parse_size), WithJsonSchema({"anyOf": [
    {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
    {"type": "string", "pattern": SIZE_PATTERN, "maxLength": _SIZE_MAX_LENGTH},
    {"type": "null"}]})]


class LimitsIn(BaseModel):
    """Per-resource lending or borrowing limits of a cohort member (Kueue's names); null: no limit."""

    model_config = ConfigDict(extra="forbid")

    gpus: StrictInt | None = Field(None, ge=0, le=INT32_MAX)
    cpus: StrictFloat | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    memory: Size = Field(None, description="bytes, or a size such as 8Gi")


class QuotaIn(BaseModel):
    """A team's limits, replaced whole: a limit left out (or null) is no limit of the team's own."""

    model_config = ConfigDict(extra="forbid")

    gpus: StrictInt | None = Field(None, ge=0, le=INT32_MAX, description="GPUs the team's jobs may hold at once")
    cpus: StrictFloat | None = Field(None, ge=0, le=1e9, allow_inf_nan=False, description="CPU cores")
    memory: Size = Field(None, description="bytes, or a size such as 8Gi, 512Mi, 1T", examples=["64Gi"])
    jobs: StrictInt | None = Field(None, ge=0, le=INT32_MAX, description="jobs holding resources at once")
    gpus_by_type: dict[GpuType, Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]] = Field(
        default_factory=dict, description='per GPU type, e.g. {"a100": 4}; counts against gpus too')
    cohort: Annotated[str, StringConstraints(pattern=r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)?$")] = Field(
        "", description="teams naming the same cohort lend each other their unused gpus, cpus and memory")
    lending_limit: LimitsIn = Field(default_factory=lambda: LimitsIn(),
                                    description="most of the team's unused quota its cohort may borrow")
    borrowing_limit: LimitsIn = Field(default_factory=lambda: LimitsIn(),
                                      description="most the team may hold beyond its quota by borrowing")
    egress: str | None = Field(None, max_length=4096, description="the team's own egress policy for sandboxed "
                               "learners: none, or comma-separated store and host:port items; it narrows the "
                               "admin's TF_EGRESS, never widens it (null: the admin's)",
                               examples=["store,pypi.internal:443"])

    @field_validator("egress")
    @classmethod
    def _egress(cls, v: str | None) -> str | None:
        return None if v is None else str(egress.parse(v, "egress"))


class Limits(BaseModel):
    gpus: int | None
    cpus: float | None
    memory: int | None = Field(description="bytes")


class Held(BaseModel):
    gpus: int | None
    cpus: float | None
    memory: int | None = Field(description="bytes")
    jobs: int | None
    gpus_by_type: dict[str, int]
    egress: str | None = Field(None, description="the team's own egress policy (null: the admin's)")


class Quota(Held):
    cohort: str = Field("", description="the team's cohort; empty: it neither lends nor borrows")
    lending_limit: Limits | None = Field(None, description="null: lends all its unused quota")
    borrowing_limit: Limits | None = Field(None, description="null: borrows without a limit")


class TeamUsage(BaseModel):
    team: str
    quota: Quota = Field(description="the team's limits; null: no limit of its own")
    in_use: Held = Field(description="what the team's active jobs hold now")
    queued_jobs: int
    active_jobs: int
    gpu_seconds: float = Field(description="consumed by the team's jobs, finished ones included")
    cpu_seconds: float
    borrowed: Borrowed | None = Field(None, description="what the team's active jobs hold on quota borrowed in "
                                                        "its cohort")


class Amounts(BaseModel):
    gpus: int = Field(ge=0)
    cpus: float = Field(ge=0)
    memory: int = Field(ge=0, description="bytes")
    learners: int = Field(ge=0, description="learner processes")


class Cluster(BaseModel):
    backend: str = Field(description="the LCM's backend; empty while its capacity is not known")
    known: bool = Field(description="whether the LCM has reported its capacity")
    unknown_reason: str = Field(description="why the capacity is not known; empty when it is")
    capacity: Amounts | None = Field(description="what the backend runs at once, as the LCM last reported it")
    held: Amounts = Field(description="what every team's active jobs hold now")
    free: Amounts | None = Field(description="capacity less what is held")
    active_jobs: int
    queued_jobs: int


class UsageList(BaseModel):
    teams: list[TeamUsage]
    accounting: UsageReport | None = Field(None, description="per-day accounting; present when `since` is given")


# -- audit ------------------------------------------------------------------------------------

class RefusedReference(BaseModel):
    field: str = Field(description="the manifest field or setting, e.g. requirements, notify.webhook")
    source: str = Field(description="where: the requirements file and line, or the URL")
    rule: str = Field(description="the rule it broke")


class AuditEntry(BaseModel):
    id: str
    ts: float = Field(description="unix time, seconds")
    key_id: str = Field(description="the caller's key id (a token's sub); empty when unauthenticated")
    team: str = Field(description="the caller's team")
    role: str
    via: str = Field(description='"key", "jwt", or empty')
    method: str
    route: str = Field(description="route template, e.g. /v1/jobs/{job_id}/cancel")
    path: str
    target: str = Field(description="id of what the request was about (job, key, team)")
    target_team: str = Field(description="the team the request was about")
    status: int = Field(description="HTTP status of the answer")
    refused: list[RefusedReference] = Field(default_factory=list, description="what the request named that the "
                                            "platform will not reach for the tenant (the request was refused)")


class AuditPage(BaseModel):
    entries: list[AuditEntry]
    next_cursor: str | None = Field(None, description="pass back as `cursor` for the next page; null: no more")


class PublicationIn(BaseModel):
    """An object-store prefix to publish, and to whom."""

    model_config = ConfigDict(extra="forbid")

    prefix: str = Field(max_length=1024, description="a store:// prefix, e.g. store://datasets/mnist/; never "
                                                     "under store://jobs/ or store://experiments/",
                        examples=["store://datasets/mnist/"])
    teams: list[Annotated[str, Field(max_length=63)]] = Field(
        min_length=1, max_length=1000, description='team names, or ["*"] for every team', examples=[["vision"]])


class Publication(BaseModel):
    prefix: str = Field(description="the store:// prefix, with its trailing slash")
    teams: list[str] = Field(description='the teams whose jobs may read it; ["*"]: every team')


class PublicationList(BaseModel):
    publications: list[Publication]

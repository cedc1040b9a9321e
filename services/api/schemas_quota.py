"""The REST shapes of quotas, usage and the cluster's capacity, and the sizes they take (8Gi, 512M)."""

from __future__ import annotations

import re
from typing import Annotated

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

from trainforge_services.api.schemas import Borrowed
from trainforge_services.api.usage import UsageReport
from trainforge_services.common import egress

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
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
    network_policy: str = Field("", description='whether the cluster enforces NetworkPolicies, as the LCM\'s '
                                'canary last saw it: "enforced", "NOT enforced" or "unknown (why)"; empty on '
                                'backends without a canary')


class UsageList(BaseModel):
    teams: list[TeamUsage]
    accounting: UsageReport | None = Field(None, description="per-day accounting; present when `since` is given")


"""Typed results: the REST shapes as pydantic models, for code that wants attributes instead of dicts.

They mirror the API's `schemas.py` and `schemas_teams.py` field by field (tests/unit/test_sdk_models.py
compares them with the served OpenAPI schema), are frozen, and ignore
fields they do not know, so an older SDK keeps working against a newer API.
`client.typed` (a `Typed`) offers the `Client` calls with these results:

    job = client.typed.wait(client.typed.submit("job.yaml").id)
    if job.state is JobState.FAILED: print(job.reason)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from trainforge.sdk import Client


class JobState(enum.StrEnum):
    PENDING = "pending"
    QUEUED = "queued"
    DEPLOYING = "deploying"
    RUNNING = "running"
    STORING = "storing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    HALTING = "halting"
    HALTED = "halted"
    RESTARTING = "restarting"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class Learner(_Model):
    rank: int
    state: str
    exit_code: int | None = None
    attempt: int
    message: str = ""
    isolation: str = ""
    warning: str = ""  # set when the learner is NOT isolated (isolation: none)


class HistoryEvent(_Model):
    from_: str = Field(alias="from")
    to: str
    reason: str = ""
    actor: str = ""
    timestamp: float
    # on the entry that reserved the job's resources: what that stint borrowed ({gpus, cpus, memory}); None: none
    borrowed: dict[str, Any] | None = None
    # on a grant to an elastic job: all it holds beyond its minimum from then on ({gpus, cpus, memory}); else None
    grown: dict[str, Any] | None = None


class WorldSize(_Model):
    current: int
    target: int
    min: int
    max: int


class Job(_Model):
    id: str
    team: str
    name: str
    state: JobState
    reason: str = ""
    queue_position: int = 0
    attempt: int = 0
    created_at: float
    updated_at: float
    learners: list[Learner] = Field(default_factory=list)
    history: list[HistoryEvent] = Field(default_factory=list)
    manifest: dict[str, Any] = Field(default_factory=dict)
    outputs_uri: str = ""
    submitted_by: str = ""
    restarts: int = 0
    checkpoint_step: int | None = None
    not_before: float = 0.0
    # quota borrowed in the team's cohort ({cohort, gpus, cpus, memory}); None: none
    borrowed: dict[str, Any] | None = None
    preemptions: int = 0
    preempted: str = ""
    world_size: WorldSize | None = None

    @property
    def ended(self) -> bool:
        return self.state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


class LogLine(_Model):
    job: str
    team: str
    learner: int
    attempt: int
    stream: str
    seq: int
    ts: str
    line: str


class LogPage(_Model):
    lines: list[LogLine]
    next: str
    job_state: JobState
    source: str = "index"
    indexed: int | None = None
    total: int | None = None
    coverage: str = ""


class Whoami(_Model):
    team: str
    key_id: str
    role: str
    via: str


class Typed:
    """The `Client` calls with typed results (`client.typed`)."""

    def __init__(self, client: Client):
        self._c = client

    def submit(self, manifest: Any, **kwargs: Any) -> Job:
        return Job.model_validate(self._c.submit(manifest, **kwargs))

    def get(self, job_id: str) -> Job:
        return Job.model_validate(self._c.get(job_id))

    def list(self, **kwargs: Any) -> list[Job]:
        return [Job.model_validate(j) for j in self._c.list(**kwargs)]

    def list_changed(self, since: float | None = None, **kwargs: Any) -> tuple[list[Job], float]:
        jobs, as_of = self._c.list_changed(since, **kwargs)
        return [Job.model_validate(j) for j in jobs], as_of

    def wait_all(self, job_ids: Iterable[str], timeout: float | None = None, poll_interval: float = 1.0) -> list[Job]:
        return [Job.model_validate(j) for j in self._c.wait_all(job_ids, timeout=timeout, poll_interval=poll_interval)]

    def cancel(self, job_id: str) -> Job:
        return Job.model_validate(self._c.cancel(job_id))

    def halt(self, job_id: str) -> Job:
        return Job.model_validate(self._c.halt(job_id))

    def resume(self, job_id: str) -> Job:
        return Job.model_validate(self._c.resume(job_id))

    def wait(self, job_id: str, timeout: float | None = None, on_change: Callable[[Job], None] | None = None,
             poll_interval: float = 1.0) -> Job:
        change = None if on_change is None else (lambda j: on_change(Job.model_validate(j)))
        return Job.model_validate(self._c.wait(job_id, timeout=timeout, on_change=change,
                                               poll_interval=poll_interval))

    def logs_page(self, job_id: str, **kwargs: Any) -> LogPage:
        return LogPage.model_validate(self._c.logs_page(job_id, **kwargs))

    def follow_logs(self, job_id: str, **kwargs: Any) -> Iterator[LogLine]:
        for line in self._c.follow_logs(job_id, **kwargs):
            yield LogLine.model_validate(line)

    def whoami(self) -> Whoami:
        return Whoami.model_validate(self._c.whoami())

"""Every value the platform keeps in etcd, one model each (keys: `trainforge_services.common.keys`).

    attempt                    AttemptInfo     the LCM's lifecycle, at deploy
    learners/<rank>/status     LearnerStatus   the controller, under its lease (final states without one);
                                               the LCM for a controller that died without reporting
    halt                       HaltRequest     the LCM (LifecycleManager.HaltJob)
    gate                       GateOpen        the LCM (LifecycleManager.OpenGate): a gated job's learners start
    learners/<rank>/checkpoint CheckpointStored the controller, after each verified checkpoint upload
    learners/<rank>/halted     Halted          the controller, after its learner stopped on a halt
    monitor                    MonitorClaim    the job monitor, under its lease

The Coordinator stores JSON objects; `value()` gives the object to store and
`parse(obj)` reads one back, raising InvalidArgument that names the key's
kind and every bad field.
"""

from __future__ import annotations

import time
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainforge_services.common.contracts.specs import problems
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.states import LEARNER_FINAL, LearnerState


class _Value(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    def value(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def parse(cls, obj: Any) -> Self:
        try:
            return cls.model_validate(obj)
        except ValidationError as e:
            raise InvalidArgument(f"invalid {cls.__name__} value in etcd: {problems(e)}") from None

    @classmethod
    def parse_or_none(cls, obj: Any) -> Self | None:
        """None for a missing or malformed value (a reader that must not stop on one bad key)."""
        if obj is None:
            return None
        try:
            return cls.model_validate(obj)
        except ValidationError:
            return None


class AttemptInfo(_Value):
    attempt: int = Field(ge=1)
    learners: int = Field(ge=1)
    checkpoint_uri: str = ""


class AttemptKilled(_Value):
    """The highest attempt of a job the LCM removed (KillJob, or a later attempt replacing it): a deploy of it,
    or of an older one, resent late, must start nothing."""

    attempt: int = Field(ge=1)
    killed_at: float = Field(default_factory=time.time)


class LearnerStatus(_Value):
    """A learner's state as its controller last wrote it.

    `tail` is filled when the learner exits (its last output lines); `step`
    and `checkpoint_uri` name the stored checkpoint a LEARNER_HALTED learner
    left. `isolation` is what the learner runs in once that is decided:
    "sandbox", "userns" (the sandbox without root) or "none"
    (services/controller/sandbox/), "container" behind a
    backend's launcher (the docker backend); "" before. `lines_archived` /
    `lines_shipped` count its log lines (archive, index) in a final status.
    """

    state: LearnerState
    attempt: int = Field(ge=0)
    exit_code: int | None = None
    ts: float = Field(default_factory=time.time)
    message: str = ""
    tail: list[str] = Field(default_factory=list)
    outputs_uri: str = ""
    step: int | None = None
    checkpoint_uri: str = ""
    isolation: str = Field("", pattern="^(sandbox|userns|container|none|)$")
    # Final statuses only: lines in the learner's log archive, and how many of them the index confirmed.
    lines_archived: int | None = None
    lines_shipped: int | None = None
    # The manifest's `timeout:` ended it: the job is over, and no restart policy gives it another attempt.
    timed_out: bool = False

    @field_validator("state", mode="before")
    @classmethod
    def _state(cls, value: Any) -> LearnerState:
        try:
            return LearnerState(int(value))
        except (TypeError, ValueError):
            raise ValueError(f"{value!r} is not a learner state") from None

    @property
    def final(self) -> bool:
        return self.state in LEARNER_FINAL

    def value(self) -> dict[str, Any]:
        out = super().value()
        out["state"] = int(self.state)
        return out


class HaltRequest(_Value):
    attempt: int = Field(ge=1)
    requested_at: float = Field(default_factory=time.time)


class GateOpen(_Value):
    """A gated job's gate is open: its controllers start their learners. Per job, not per attempt: a gate is
    opened once and never closed again (`attempt` is the one the Trainer saw, for the record)."""

    attempt: int = Field(ge=0)
    opened_at: float = Field(default_factory=time.time)


class CheckpointStored(_Value):
    attempt: int = Field(ge=0)
    step: int = Field(ge=0)
    uri: str


class Halted(_Value):
    """A halted learner's last stored checkpoint (step None, uri "": it never saved one)."""

    attempt: int = Field(ge=0)
    step: int | None = None
    checkpoint_uri: str = ""


class MonitorClaim(_Value):
    """Who monitors a job: one process at a time, held under that monitor's lease."""

    pid: int
    host: str
    attempt: int = Field(ge=0)

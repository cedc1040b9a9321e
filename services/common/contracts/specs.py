"""The spec files a backend hands the processes it starts: one per learner's controller, one per job monitor.

The LCM's lifecycle builds them (`services/lcm/lifecycle/plan.py`); the
controller and the job monitor parse them at start-up, so a malformed spec
fails at once with every bad field named instead of somewhere in the middle
of a run. Unknown keys are ignored: a newer LCM may add fields before an
older process reads them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainforge_services.common.contracts import storekeys
from trainforge_services.common.contracts.ids import is_job_id
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import Manifest

# Inside a learner's workdir. Not "checkpoints": a code folder that was also run by hand may ship one,
# and a learner would resume from that stale state.
CHECKPOINT_SUBDIR = ".trainforge/checkpoints"


def problems(e: ValidationError) -> str:
    """'field: message; other.field: message' for a pydantic error."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg'].removeprefix('Value error, ')}"
        for err in e.errors(include_url=False))


class _Spec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    kind: ClassVar[str] = "spec"

    @field_validator("job_id", check_fields=False)
    @classmethod
    def _job_id(cls, value: str) -> str:
        if not is_job_id(value):
            raise ValueError(f"{value!r} is not a valid job id")
        return value

    @classmethod
    def parse(cls, raw: str | bytes, source: str = "spec") -> Self:
        """Validate JSON text; InvalidArgument names `source` and every bad field."""
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise InvalidArgument(f"{source} is not valid JSON: {e}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise InvalidArgument(f"invalid {source}: {problems(e)}") from None

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Read and validate a spec file."""
        try:
            raw = Path(path).read_bytes()
        except OSError as e:
            raise InvalidArgument(f"cannot read {cls.kind} {path}: {e.strerror or e}") from None
        return cls.parse(raw, f"{cls.kind} {path}")

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


class LearnerSpec(_Spec):
    """What one learner's controller needs to prepare, run and report its learner."""

    kind: ClassVar[str] = "learner spec"

    job_id: str
    team: str = ""
    attempt: int = Field(ge=0)
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    manifest: Manifest
    code_uri: str = ""
    checkpoint_uri: str = ""
    workdir: Path
    master_addr: str = "127.0.0.1"
    master_port: int = Field(29500, ge=1, le=65535)
    gpu_ids: list[int] = Field(default_factory=list)
    lease_ttl: int = Field(10, ge=2, le=300)
    # argv the controller puts before `/bin/sh -c command`: a backend's way to run the command elsewhere (the
    # docker backend's runner starts it in a container); empty: the command runs here
    launcher: list[str] = Field(default_factory=list)
    # the team's own egress policy (trainforge_services.common.egress), narrowing the admin's TF_EGRESS; "": none of its own
    egress: str = ""
    # prepare everything, then wait for the job's etcd `gate` key before starting the learner (a trial started
    # ahead of its slot: docs/EXPERIMENTS.md, "Prestarted trials")
    gated: bool = False
    # object keys (objects or prefixes) the controller may fetch besides the job's own jobs/<id>/: its code
    # archive when that is an experiment's, its data sources (granted by the Trainer: services/common/storeaccess.py)
    reads: list[str] = Field(default_factory=list)
    # Values of the team secrets the manifest's env names, by variable: only in the spec file the
    # controller reads (0600), never in a record, a repr or a log (`model_dump` leaves them out).
    secret_env: dict[str, str] = Field(default_factory=dict, exclude=True, repr=False)

    def to_json(self) -> str:
        # without a launcher or a team egress policy the spec reads as it always did
        data = self.model_dump(mode="json", exclude={k for k in ("launcher", "egress", "gated", "reads")
                                                       if not getattr(self, k)})
        if self.secret_env:
            data["secret_env"] = dict(self.secret_env)
        return json.dumps(data, indent=2)

    @model_validator(mode="after")
    def _consistent(self) -> LearnerSpec:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} must be less than world_size {self.world_size}")
        if not self.workdir.is_absolute():
            raise ValueError(f"workdir {self.workdir} must be an absolute path")
        return self

    @property
    def checkpoint_dir(self) -> Path:
        return self.workdir / CHECKPOINT_SUBDIR

    @property
    def output_dir(self) -> Path:
        return self.workdir / self.manifest.outputs

    @property
    def archive_path(self) -> Path:
        """The learner's local log archive, next to (not inside) its working directory."""
        return self.workdir.parent / f"learner-{self.rank}-{self.attempt}.log.jsonl"

    @property
    def exit_reason_path(self) -> Path:
        """Where a launcher explains how the command ended (e.g. OOM-killed at its limit), next to the archive."""
        return self.workdir.parent / f"learner-{self.rank}-{self.attempt}.reason"

    @property
    def outputs_prefix(self) -> str:
        return storekeys.outputs_prefix(self.job_id, self.rank)

    @property
    def log_key(self) -> str:
        return storekeys.log_key(self.job_id, self.rank, self.attempt)


class MonitorSpec(_Spec):
    """What one attempt's job monitor needs to follow its learners."""

    kind: ClassVar[str] = "monitor spec"

    job_id: str
    team: str = ""
    attempt: int = Field(ge=0)
    # learners started with the attempt (ranks 0..learners-1); each must start within start_timeout
    learners: int = Field(ge=1)
    start_timeout: float = Field(300.0, gt=0)
    # an elastic job (manifest `learners: {min, max}`): slots 0..max_learners-1, the job fails only when
    # fewer than min_learners remain; 0 for a job of fixed size
    min_learners: int = Field(0, ge=0)
    max_learners: int = Field(0, ge=0)

    @property
    def elastic(self) -> bool:
        return self.max_learners > 0

    def to_json(self) -> str:
        # a fixed-size job's spec reads as it always did
        return self.model_dump_json(indent=2, exclude=None if self.elastic else {"min_learners", "max_learners"})

    @property
    def slots(self) -> int:
        """The ranks the monitor follows: the attempt's learners, or every slot of an elastic job."""
        return self.max_learners if self.elastic else self.learners

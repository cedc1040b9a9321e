"""The learner spec file the LCM writes (docs/CONTRACTS.md, `learner-<r>.json`).

Parsed once at start-up into a frozen model, so a malformed spec fails with
every bad field named instead of somewhere in the middle of a run. Unknown
keys are ignored: the LCM may add fields before the controller reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from services.common.errors import InvalidArgument
from services.common.manifest import Manifest

# Not "checkpoints": a code folder that was also run by hand may ship one, and
# a learner would resume from that stale state.
CHECKPOINT_SUBDIR = ".trainforge/checkpoints"


class LearnerSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str = Field(min_length=1)
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
    def outputs_prefix(self) -> str:
        return f"jobs/{self.job_id}/outputs/{self.rank}/"

    @property
    def log_key(self) -> str:
        return f"jobs/{self.job_id}/logs/{self.rank}-{self.attempt}.jsonl"


def load_spec(path: Path) -> LearnerSpec:
    """Read and validate a spec file; InvalidArgument names the file and every bad field."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise InvalidArgument(f"cannot read learner spec {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise InvalidArgument(f"learner spec {path} is not valid JSON: {e}") from None
    try:
        return LearnerSpec.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg'].removeprefix('Value error, ')}"
            for err in e.errors(include_url=False))
        raise InvalidArgument(f"invalid learner spec {path}: {problems}") from None

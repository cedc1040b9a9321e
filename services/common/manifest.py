"""The job manifest: what a user asks the platform to run.

A manifest is validated once, at submit, and every problem is reported with
the dotted path of its field (`resources.memory: ...`). After that the
validated model travels as JSON (`Manifest.model_dump_json()`), so every
service reads the same normalised values (memory in bytes, durations in
seconds: `quantities.py` reads them). `manifest_text.py` reads the text.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainforge_services.common import manifest_text, reqlines
from trainforge_services.common.errors import InvalidArgument, RefusedReference
from trainforge_services.common.quantities import Duration, Memory

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# A team secret's name (services/common/secrets.py): what `env: {VAR: {secret: <name>}}` may refer to.
SECRET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
SECRET_NAME_RULE = "1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit"
_GPU_TYPE = re.compile(r"^[a-z0-9-]{1,32}$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_MAX_LABELS = 32


class Framework(enum.StrEnum):
    TORCH = "torch"
    CUSTOM = "custom"


class Priority(enum.IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(_Strict):
    """Per learner."""

    gpus: int = Field(0, ge=0, le=64, description="GPUs per learner")
    cpus: float = Field(1.0, gt=0, le=256, description="CPU cores per learner")
    memory: Memory = Field(2 * 2**30, description="memory per learner, e.g. 4Gi")
    pids: int = Field(4096, ge=16, le=4_194_304,
                      description="processes and threads per learner (enforced in the sandbox; stops fork bombs)")
    gpu_type: str | None = Field(None, max_length=32,
                                 description="GPU model, e.g. a100; counts against the team's quota for it")

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, v: str | None) -> str | None:
        if v is not None and not _GPU_TYPE.match(v):
            raise ValueError("must be 1-32 lowercase letters, digits or '-'")
        return v


class DataSource(_Strict):
    source: str = Field(description="object-store URI, e.g. store://datasets/mnist")
    path: str = Field(description="where it lands, relative to the learner's working directory")

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        return _relative_path(v)


class Restart(_Strict):
    max_restarts: int = Field(0, ge=0, le=100)
    backoff: Duration = Field(10.0, description="wait before a redeploy, e.g. 10s")


class Checkpoint(_Strict):
    interval: Duration = Field(300.0, description="how often trainforge_frameworks' checkpoint_due() says yes, e.g. 5m; 0: never")


def _relative_path(v: str) -> str:
    v = v.strip()
    if not v or v.startswith("/") or ".." in v.split("/"):
        raise ValueError("must be a relative path inside the working directory, without '..'")
    return v


class SecretRef(_Strict):
    """`{secret: name}`: the value of the team's secret `name`, put into the learner's environment at start.

    Only the reference is part of the job; the value never is (services/common/secrets.py).
    """

    secret: str = Field(description=f"the name of a team secret: {SECRET_NAME_RULE}")

    @field_validator("secret")
    @classmethod
    def _secret(cls, v: str) -> str:
        if not SECRET_NAME.match(v):
            raise ValueError(f"must be {SECRET_NAME_RULE}")
        return v


class Notify(_Strict):
    """Where the job's terminal and halted states are announced (signed POSTs; services/common/webhooks.py)."""

    webhook: str = Field(description="an http(s) URL that receives a signed JSON POST per terminal or halted state",
                         max_length=2048, pattern=r"^https?://[^\s]+$")


class LearnerRange(_Strict):
    """`learners: {min, max}`: an elastic job (docs/ARCHITECTURE.md, "Elastic jobs").

    It starts with as many learners as fit (at least `min`), grows up to
    `max` as capacity frees, and shrinks instead of failing when a learner is
    lost while at least `min` remain. Each learner is a torchrun agent node.
    """

    min: int = Field(ge=1, le=64, description="fewest learners the job runs with")
    max: int = Field(ge=1, le=64, description="most learners the job grows to")

    @field_validator("max")
    @classmethod
    def _max(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("min")
        if isinstance(low, int) and v < low:
            raise ValueError(f"must be at least min ({low})")
        return v


# The union's branches are tagged so a bad value is reported at `learners` or `learners.min`/`.max`
# (`field_errors` drops the tag from the path).
_LEARNER_TAGS = ("count", "range")


def _learners_kind(v: Any) -> Literal["count", "range"]:
    return "range" if isinstance(v, dict | LearnerRange) else "count"


Learners = Annotated[
    Annotated[int, Field(ge=1, le=64), Tag("count")] | Annotated[LearnerRange, Tag("range")],
    Discriminator(_learners_kind),
]


class Manifest(_Strict):
    name: str = Field(description="lowercase letters, digits and '-', at most 63 characters")
    framework: Framework = Framework.TORCH
    learners: Learners = Field(1, description="number of learners (>1 is distributed), or {min, max}: elastic")
    resources: Resources = Resources()
    command: str = Field(min_length=1, description="run in the learner's working directory; {{param}} is filled from params")
    params: dict[str, str | int | float | bool] = Field(default_factory=dict)
    env: dict[str, str | SecretRef] = Field(
        default_factory=dict, description="the learner's environment; a value {secret: name} is a team secret")
    code: str | None = Field(None, description="a local folder the CLI packs and uploads")
    data: list[DataSource] = Field(default_factory=list)
    outputs: str = Field("outputs/", description="folder uploaded when the learners finish")
    restart: Restart = Restart()
    checkpoint: Checkpoint = Checkpoint()
    priority: Priority = Priority.NORMAL
    image: str | None = Field(None, description="container image (kubernetes and docker backends)")
    requirements: str | list[str] | None = Field(
        None, description="packages the learner needs: a requirements file in the code folder, or a list of "
                          "requirement strings; the local backend builds (and caches) a virtual environment")
    labels: dict[str, str] = Field(default_factory=dict, description="key: value pairs to filter jobs by")
    timeout: Duration | None = Field(None, description="the longest the learners may run, e.g. 2h; "
                                                       "exceeding it fails the job (checkpoints are kept)")
    notify: Notify | None = Field(None, description="{webhook: URL}: announce terminal and halted states")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-63 lowercase letters, digits or '-', starting and ending alphanumeric")
        return v

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, v: str) -> str:
        return _relative_path(v)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return Priority[v.strip().upper()]
            except KeyError:
                raise ValueError("must be one of low, normal, high") from None
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str | SecretRef]) -> dict[str, str | SecretRef]:
        bad = [k for k in v if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)]
        if bad:
            raise ValueError(f"invalid variable names: {', '.join(sorted(bad))}")
        return v

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, str):
            return _relative_path(v)
        if isinstance(v, list):
            reqlines.list_lines(v)  # the same rules as a requirements file's lines (services/common/reqlines.py)
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > _MAX_LABELS:
            raise ValueError(f"at most {_MAX_LABELS} labels")
        for key, value in v.items():
            if not _LABEL_KEY.match(key):
                raise ValueError(f"label {key!r}: keys are 1-63 letters, digits, '-', '_' or '.', "
                                 "starting alphanumeric")
            if len(value) > 63 or "=" in value or "," in value:
                raise ValueError(f"label {key}: values are at most 63 characters, without '=' or ','")
        return v

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, v: float | None) -> float | None:
        if v is not None and v <= 0:
            raise ValueError("must be greater than 0; leave it out for no limit")
        return v

    @property
    def elastic(self) -> bool:
        """`learners: {min, max}`: the job's size changes while it runs."""
        return isinstance(self.learners, LearnerRange)

    @property
    def min_learners(self) -> int:
        """The fewest learners the job runs with (what admission needs): the count, or `learners.min`."""
        return self.learners.min if isinstance(self.learners, LearnerRange) else self.learners

    @property
    def max_learners(self) -> int:
        """The most learners the job runs with: the count, or `learners.max`."""
        return self.learners.max if isinstance(self.learners, LearnerRange) else self.learners

    def plain_env(self) -> dict[str, str]:
        """The env values given in the manifest itself (no secrets)."""
        return {k: v for k, v in self.env.items() if isinstance(v, str)}

    def secret_env(self) -> dict[str, str]:
        """Variable -> the name of the team secret it takes its value from."""
        return {k: v.secret for k, v in self.env.items() if isinstance(v, SecretRef)}

    @model_validator(mode="after")
    def _elastic_torch(self) -> Manifest:
        if self.elastic and self.framework != Framework.TORCH:
            # ValueError has no field here: name it the way field_errors would
            raise ValueError("learners: {min, max} (elastic) needs framework torch: each learner is a torchrun node")
        return self

    @model_validator(mode="after")
    def _placeholders(self) -> Manifest:
        missing = sorted(set(_PLACEHOLDER.findall(self.command)) - set(self.params))
        if missing:
            raise ValueError(f"command uses {{{{{missing[0]}}}}} but params does not define: {', '.join(missing)}")
        return self

    def rendered_command(self) -> str:
        """The command with every {{param}} filled in."""
        return _PLACEHOLDER.sub(lambda m: str(self.params[m.group(1)]), self.command)


def field_errors(exc: ValidationError) -> list[dict]:
    """Each pydantic error as {field: dotted path, message} (also for the other recipe parsers,
    services/common/contracts/experiments.py)."""
    out = []
    for err in exc.errors(include_url=False):
        parts = list(err["loc"])
        if parts[:1] == ["learners"]:
            parts = [p for p in parts if p not in _LEARNER_TAGS]
        loc = ".".join(str(p) for p in parts) or "manifest"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        out.append({"field": loc, "message": msg})
    return out


def parse_manifest(source: str | bytes | dict) -> Manifest:
    """Parse YAML/JSON text or a dict into a Manifest.

    Raises InvalidArgument listing every problem, each naming its field.
    """
    data: Any = source if isinstance(source, dict) else manifest_text.load(source)
    if not isinstance(data, dict):
        raise InvalidArgument("manifest must be a mapping of fields",
                              details=[{"field": "manifest", "message": "must be a mapping of fields"}])
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        details = field_errors(e)
        summary = "; ".join(f"{d['field']}: {d['message']}" for d in details)
        refused = [err["ctx"]["error"].refusal.audit() for err in e.errors(include_url=False)
                   if isinstance((err.get("ctx") or {}).get("error"), reqlines.RefusedLine)]
        if refused:
            raise RefusedReference(f"invalid manifest: {summary}", refusals=refused, details=details) from None
        raise InvalidArgument(f"invalid manifest: {summary}", details=details) from None

"""What a backend is to the LCM: it launches, stops, observes and reports capacity. Nothing more.

The lifecycle (`trainforge_services.lcm.lifecycle`) owns every attempt: it validates
the request, builds the `AttemptPlan` (per-rank learner specs, the monitor
spec, rendezvous, GPU assignment), writes etcd, keeps the attempt's record,
reports lost controllers and decides when a job monitor is started again.
A backend only turns a plan into running processes (or pods), says which of
them still run, and removes them. Adding a backend means implementing
`Backend` and naming it in `backends/__init__.py:make_backend`.

Handles are typed (`Handle`: role, rank, backend id); `str(handle)` renders
the "role:id" form the gRPC response carries for diagnostics.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainforge_services.common import egress
from trainforge_services.common.contracts.specs import LearnerSpec, MonitorSpec
from trainforge_services.common.manifest import Manifest


class Role(enum.Enum):
    MONITOR = "monitor"
    CONTROLLER = "controller"


def process_name(role: Role, rank: int | None = None) -> str:
    """'monitor' or 'controller-<rank>': unique within an attempt (also its log's and spec's stem)."""
    return role.value if role is Role.MONITOR else f"{role.value}-{rank}"


@dataclass(frozen=True)
class Handle:
    """One process (or pod) of an attempt; `ref` is the backend's own id for it (a pid, a pod name)."""

    role: Role
    ref: str
    rank: int | None = None

    @property
    def name(self) -> str:
        return process_name(self.role, self.rank)

    def __str__(self) -> str:
        return f"{self.name}:{self.ref}"


@dataclass(frozen=True)
class Observed:
    handle: Handle
    alive: bool
    # the backend's own words on why it ended or is stuck (a cluster's "OOMKilled: ...", "Unschedulable: ...")
    reason: str = ""


@dataclass(frozen=True)
class JobView:
    """What a backend sees of one job's attempt now."""

    job_id: str
    processes: tuple[Observed, ...] = ()
    # the attempt's job monitor left its `monitor.done` marker: it delivered the attempt's last state
    monitor_done: bool = False

    @property
    def alive(self) -> bool:
        return any(o.alive for o in self.processes)

    @property
    def handles(self) -> list[Handle]:
        return [o.handle for o in self.processes]

    def names(self) -> set[str]:
        """The names of every process the backend started for the attempt, running or not."""
        return {o.handle.name for o in self.processes}


@dataclass(frozen=True)
class Site:
    """Where a backend places an attempt: its directory (specs, logs, workdirs) and its rendezvous."""

    attempt_dir: Path
    master_addr: str
    master_port: int


class TeamQuota(BaseModel):
    """A team's quota as the Trainer holds it (DeployJobRequest.team_quota); None: no limit on that dimension.

    Backends that mirror quotas into where they run (kubernetes: the team namespace's ResourceQuotas) bring
    them in step at each deploy; the others ignore it (the Trainer's admission enforces it either way).
    """

    model_config = ConfigDict(frozen=True)

    gpus: int | None = Field(None, ge=0)
    cpus: float | None = Field(None, ge=0)
    memory: int | None = Field(None, ge=0)
    jobs: int | None = Field(None, ge=0)
    gpus_by_type: dict[str, int] = Field(default_factory=dict)
    # the team's own egress policy for sandboxed learners, narrowing the admin's; None: none of its own
    egress: str | None = None

    @field_validator("egress")
    @classmethod
    def _egress(cls, v: str | None) -> str | None:
        return None if v is None else str(egress.parse(v, "the team's egress policy"))


# the services' own keys and MongoDB's connection string (with its credentials, where it has any: only the API
# and the Trainer use MongoDB): no job process inherits them, whatever the LCM's environment holds
SERVICE_KEYS = ("TF_CREDENTIALS_KEY", "TF_SECRETS_KEY", "TF_JWT_SECRET", "TF_SERVICE_TOKEN", "TF_MONGO_URL")


class Grant(BaseModel):
    """The job's own credentials, in place of the platform's, for its controllers and its monitor.

    Minted by the lifecycle's issuers (`lifecycle/credentials.py`) for each attempt it hands a backend: env
    vars each role gets on top of the platform's settings, and the platform's env vars neither may inherit
    (`withheld`). Never persisted: `AttemptPlan.grant` is left out of every dump.
    """

    model_config = ConfigDict(frozen=True)

    controller: dict[str, str] = Field(default_factory=dict)
    monitor: dict[str, str] = Field(default_factory=dict)
    withheld: tuple[str, ...] = ()

    def env_for(self, role: Role, platform: dict[str, str]) -> dict[str, str]:
        """`platform` (the env a backend would give the role) less what is withheld, plus the role's own."""
        env = {k: v for k, v in platform.items() if k not in self.withheld}
        env.update(self.monitor if role is Role.MONITOR else self.controller)
        return env


class JobDeployment(BaseModel):
    """One attempt of one job, as the Trainer asked for it (validated once, by the lifecycle)."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    team: str
    attempt: int
    manifest: Manifest
    code_uri: str = ""
    checkpoint_uri: str = ""
    # Team secrets for the learners' env (DeployJobRequest.secret_env): kept out of every dump, so the
    # attempt record the lifecycle persists never holds them.
    secret_env: dict[str, str] = Field(default_factory=dict, exclude=True, repr=False)
    team_quota: TeamQuota | None = None
    # its learners wait for the job's gate before they start (DeployJobRequest.gated)
    gated: bool = False
    # object keys its learners may read besides the job's own (DeployJobRequest.reads)
    reads: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        """Learners the attempt needs: the manifest's count, or an elastic job's minimum."""
        return self.manifest.min_learners

    @property
    def gpus(self) -> int:
        """GPUs the whole attempt needs."""
        return self.manifest.resources.gpus * self.world_size


class AttemptPlan(JobDeployment):
    """One attempt of one job, everything decided: the only thing a backend is handed to launch."""

    attempt_dir: Path
    master_addr: str
    master_port: int
    gpu_ids: tuple[tuple[int, ...], ...]
    learners: tuple[LearnerSpec, ...]
    monitor: MonitorSpec
    # the attempt's own credentials (`Grant`): attached by the lifecycle whenever it hands the plan to the
    # backend, never stored with the attempt's record
    grant: Grant = Field(default_factory=Grant, exclude=True, repr=False)

    @property
    def world_size(self) -> int:
        """Learners launched: every rank for a fixed-size job; the slots started so far for an elastic one."""
        return len(self.learners)

    @property
    def all_gpus(self) -> set[int]:
        return {g for rank in self.gpu_ids for g in rank}

    def expected(self) -> set[str]:
        """The handle names a fully launched attempt has."""
        return {process_name(Role.MONITOR), *(process_name(Role.CONTROLLER, r) for r in range(self.world_size))}


@dataclass(frozen=True)
class Capacity:
    """What a backend can run at once, in total."""

    backend: str
    gpus: int
    cpus: float
    memory: int
    max_learners: int
    # whether the backend's network enforces NetworkPolicies, as its canary saw it ("": the backend has none)
    network_policy: str = ""


class Backend(abc.ABC):
    """Runs the processes of attempt plans; holds no lifecycle decisions and never touches etcd."""

    name: str = ""

    @abc.abstractmethod
    def site(self, job_id: str, attempt: int) -> Site:
        """Where the attempt will run (the lifecycle puts it into the plan's specs)."""

    @abc.abstractmethod
    def launch(self, plan: AttemptPlan) -> list[Handle]:
        """Start the plan's job monitor and controllers (monitor first); their handles.

        On failure what was started stays recorded: the lifecycle stops the job.
        """

    @abc.abstractmethod
    def stop(self, job_id: str) -> int:
        """Stop everything of a job, every attempt, monitor first; forget it. How many were running."""

    @abc.abstractmethod
    def observe(self, plan: AttemptPlan) -> JobView:
        """What of the plan's attempt runs now and whether its monitor delivered the last state."""

    @abc.abstractmethod
    def restart_monitor(self, plan: AttemptPlan) -> Handle:
        """Start the attempt's job monitor again (the lifecycle saw it gone before it delivered)."""

    def launch_learners(self, plan: AttemptPlan, ranks: list[int]) -> list[Handle]:
        """Start the controllers of `ranks` of a running attempt (an elastic job grows, or a lost learner's
        slot is filled again); `plan` already holds their specs. Their handles."""
        raise NotImplementedError(f"the {self.name} backend cannot add learners to a running job")

    @abc.abstractmethod
    def capacity(self) -> Capacity:
        """The backend's total resources (not what is free: the lifecycle and the Trainer account for usage)."""

    def mirror_quota(self, team: str, quota: TeamQuota) -> bool:
        """Bring the copy of a team's quota kept where jobs run in step with `quota`; False when the backend
        keeps none (the Trainer's admission enforces quotas either way)."""
        return False

    def recover(self) -> list[AttemptPlan]:
        """Plans of attempts the backend can find without the lifecycle's records (e.g. by label); none here."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing
        """Release connections. Running jobs are left running."""

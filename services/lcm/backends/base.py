"""What every backend offers the LCM, and the deployment request in the backend's terms.

The LCM's gRPC layer speaks protos; backends speak `JobDeployment`, a
validated value (the manifest parsed once, the job id checked to be safe as
a path segment and an etcd key), so a backend never re-validates and never
sees a malformed request.
"""

from __future__ import annotations

import abc
import re
import time
from dataclasses import dataclass, field

from protos import lcm_pb2
from services.common.adapters.etcd import Coordinator
from services.common.errors import InvalidArgument
from services.common.manifest import Manifest, parse_manifest

# Job ids become directory names, etcd key segments and (on Kubernetes) label values.
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.match(job_id or "") or ".." in job_id:
        raise InvalidArgument(
            f"job_id {job_id!r} is not valid: use 1-63 letters, digits, '.', '_' or '-', starting alphanumeric",
            details=[{"field": "job_id", "message": "must be 1-63 letters, digits, '.', '_' or '-'"}])
    return job_id


@dataclass(frozen=True)
class JobDeployment:
    """One attempt of one job, as a backend deploys it."""

    job_id: str
    team: str
    attempt: int
    manifest: Manifest
    code_uri: str = ""
    checkpoint_uri: str = ""

    @classmethod
    def from_request(cls, request: lcm_pb2.DeployJobRequest) -> JobDeployment:
        """Validate a DeployJobRequest; InvalidArgument names the field at fault."""
        check_job_id(request.job_id)
        if not request.team:
            raise InvalidArgument("team is required", details=[{"field": "team", "message": "required"}])
        if request.attempt < 1:
            raise InvalidArgument(f"attempt must be 1 or more, got {request.attempt}",
                                  details=[{"field": "attempt", "message": "must be 1 or more"}])
        if not request.manifest_json:
            raise InvalidArgument("manifest_json is required",
                                  details=[{"field": "manifest_json", "message": "required"}])
        return cls(job_id=request.job_id, team=request.team, attempt=request.attempt,
                   manifest=parse_manifest(request.manifest_json), code_uri=request.code_uri,
                   checkpoint_uri=request.checkpoint_uri)

    @property
    def learners(self) -> int:
        return self.manifest.learners


@dataclass(frozen=True)
class Capacity:
    """What a backend can run at once, in total."""

    backend: str
    gpus: int
    cpus: float
    memory: int
    max_learners: int


@dataclass(frozen=True)
class RunningJob:
    """A job attempt a backend runs now."""

    job_id: str
    attempt: int
    learners: int
    handles: list[str] = field(default_factory=list)


class Backend(abc.ABC):
    """Turns a job attempt into running learners plus its job monitor, and removes them again."""

    name: str = ""
    # Every backend coordinates its learners through etcd; `halt` writes there.
    _coord: Coordinator

    @abc.abstractmethod
    def deploy(self, job: JobDeployment) -> list[str]:
        """Start the attempt's job monitor and learners; handles (pids, pod names) for diagnostics.

        Idempotent per (job, attempt): a repeated call while they run starts
        nothing and returns the same handles. A later attempt replaces an
        earlier one; an earlier attempt than the one running is a Conflict.
        """

    @abc.abstractmethod
    def kill(self, job_id: str) -> int:
        """Stop and remove everything of a job, all attempts, and its etcd keys. Idempotent.

        Returns how many processes (or pods) were still running.
        """

    def halt(self, job_id: str, attempt: int) -> None:
        """Ask an attempt's learners to checkpoint and exit: the job's `halt` key (docs/CONTRACTS.md).

        Idempotent; a halt for an attempt that no longer runs is ignored by
        every controller (they compare the attempt).
        """
        self._coord.put(self._coord.keys.halt(job_id), {"attempt": attempt, "requested_at": time.time()})

    @abc.abstractmethod
    def capacity(self) -> Capacity:
        """The backend's total resources (not what is free: the Trainer accounts for usage)."""

    @abc.abstractmethod
    def running_jobs(self) -> list[RunningJob]:
        """Attempts with something still running."""

    def close(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing
        """Release connections. Running jobs are left running."""

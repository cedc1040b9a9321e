"""The Trainer's view of the LCM: a few calls, behind an interface a test can fake.

The dispatcher and the service depend on `Lcm`, not on gRPC, so unit tests
can hand them a plain Python object; `GrpcLcm` is the real thing, and turns
the LCM's gRPC errors into the platform's domain errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from trainforge_protos import lcm_pb2, lcm_pb2_grpc
from trainforge_services.common import rpc
from trainforge_services.common.election import FOLLOWING
from trainforge_services.common.errors import Unavailable
from trainforge_services.trainer.resources import BackendSize, Quota, Usage


class Lcm(Protocol):
    def deploy_job(self, job_id: str, team: str, attempt: int, manifest_json: str, code_uri: str,
                   checkpoint_uri: str = "", *, secret_env: Mapping[str, str] | None = None,
                   reads: Sequence[str] = (), gated: bool = False) -> list[str]:
        """Start one attempt's learners; idempotent per (job_id, attempt). The backend's handles.

        secret_env: the values of the team secrets the manifest's env names, by variable (secret_env.py).
        reads: the object keys the learners may read beyond the job's own (services/trainer/storerefs.py).
        gated: the learners prepare and wait for `open_gate` before they start (a prestarted trial).
        """

    def open_gate(self, job_id: str, attempt: int) -> None:
        """Let a gated job's learners start; idempotent (a job's gate is never closed again)."""

    def kill_job(self, job_id: str, reason: str = "", attempt: int = 0) -> int:
        """Remove everything of a job; idempotent. How many processes/pods were killed.

        attempt: the job's current attempt (0: not known); the LCM marks it killed even if its deploy has not
        reached it yet, so that deploy is refused when it arrives.
        """

    def halt_job(self, job_id: str, attempt: int) -> None:
        """Ask one attempt's learners to checkpoint and exit; idempotent."""

    def grow_job(self, job_id: str, attempt: int, learners: int) -> bool:
        """Grant a running elastic attempt up to `learners` learners (services/trainer/growth.py); idempotent.
        False when no such attempt runs there."""

    def get_capacity(self) -> BackendSize:
        """What the backend can run at once."""

    def sync_team(self, team: str, quota: Quota) -> bool:
        """A team's quota changed: a backend that mirrors quotas brings its copy in step (False: it keeps none)."""


def team_quota_to_proto(quota: Quota) -> lcm_pb2.TeamQuota:
    limits = {k: v for k, v in (("gpus", quota.gpus), ("cpus", quota.cpus), ("memory", quota.memory),
                                ("jobs", quota.jobs), ("egress", quota.egress)) if v is not None}
    return lcm_pb2.TeamQuota(**limits, gpus_by_type=dict(quota.gpus_by_type))


class GrpcLcm:
    def __init__(self, address: str, timeout: float = 30.0, *, quota_of: Callable[[str], Quota] | None = None,
                 authorization: str = ""):
        """`quota_of(team)`: the team's quota, sent with every deploy (DeployJobRequest.team_quota);
        `authorization`: the service credential sent with every call (common/rpcauth.py).

        `address` may list LCM replicas; only the elected one serves these calls, and a follower's
        refusal is asked again of the next replica at once (round-robin), up to once per replica.
        """
        self._tries = 1 + 2 * address.count(",")
        self._address = address
        self._authorization = authorization
        self._channel = rpc.channel(address, authorization=authorization)
        self._stub = lcm_pb2_grpc.LifecycleManagerStub(self._channel)
        self._timeout = timeout
        self._quota_of = quota_of

    def deploy_job(self, job_id: str, team: str, attempt: int, manifest_json: str, code_uri: str,
                   checkpoint_uri: str = "", *, secret_env: Mapping[str, str] | None = None,
                   reads: Sequence[str] = (), gated: bool = False) -> list[str]:
        request = lcm_pb2.DeployJobRequest(job_id=job_id, team=team, attempt=attempt,
                                           manifest_json=manifest_json, code_uri=code_uri,
                                           checkpoint_uri=checkpoint_uri, secret_env=dict(secret_env or {}),
                                           reads=list(reads), gated=gated)
        if self._quota_of is not None:
            request.team_quota.CopyFrom(team_quota_to_proto(self._quota_of(team)))
        return list(self._call(self._stub.DeployJob, request, self._timeout).handles)

    def kill_job(self, job_id: str, reason: str = "", attempt: int = 0) -> int:
        request = lcm_pb2.KillJobRequest(job_id=job_id, reason=reason, attempt=attempt)
        return self._call(self._stub.KillJob, request, self._timeout).killed

    def halt_job(self, job_id: str, attempt: int) -> None:
        self._call(self._stub.HaltJob, lcm_pb2.LcmHaltJobRequest(job_id=job_id, attempt=attempt), self._timeout)

    def open_gate(self, job_id: str, attempt: int) -> None:
        self._call(self._stub.OpenGate, lcm_pb2.OpenGateRequest(job_id=job_id, attempt=attempt), self._timeout)

    def grow_job(self, job_id: str, attempt: int, learners: int) -> bool:
        request = lcm_pb2.GrowJobRequest(job_id=job_id, attempt=attempt, learners=learners)
        return self._call(self._stub.GrowJob, request, self._timeout).granted

    def get_capacity(self) -> BackendSize:
        cap = self._call(self._stub.GetCapacity, lcm_pb2.GetCapacityRequest(), self._timeout)
        total = Usage(cap.total.gpus, cap.total.cpus, cap.total.memory, cap.max_learners)
        return BackendSize(total, cap.backend, cap.network_policy)

    def sync_team(self, team: str, quota: Quota) -> bool:
        request = lcm_pb2.SyncTeamRequest(team=team, quota=team_quota_to_proto(quota))
        return self._call(self._stub.SyncTeam, request, self._timeout).mirrored

    def _call(self, method: Callable, request: object, timeout: float):  # noqa: ANN202 - the method's reply
        for _ in range(self._tries - 1):
            try:
                return rpc.call(method, request, timeout)
            except Unavailable as e:
                if FOLLOWING not in e.message:
                    raise
        try:
            return rpc.call(method, request, timeout)
        except Unavailable as e:
            if FOLLOWING in e.message:
                # one address behind a Service: a new connection may reach the leader (the only ready pod);
                # the old channel is left to close when its in-flight calls let go of it
                self._channel = rpc.channel(self._address, authorization=self._authorization)
                self._stub = lcm_pb2_grpc.LifecycleManagerStub(self._channel)
            raise

    def close(self) -> None:
        self._channel.close()

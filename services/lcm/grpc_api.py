"""The LCM's gRPC face: requests become lifecycle calls, results become messages.

Validation happens once, in `deployment_from_request`; the lifecycle and
its backend then work with well-formed values only. Handles go back as
"role:id" strings, for diagnostics only. Domain errors become status codes in
`rpc.handler`, so the Trainer sees the lifecycle's message (e.g. "needs 4
GPU(s); the local backend has 2 of 8 free"), never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from trainforge_protos import common_pb2, lcm_pb2, lcm_pb2_grpc
from trainforge_services.common.contracts.ids import check_job_id
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.rpc import handler
from trainforge_services.lcm.lifecycle import (
    LifecycleManager,
    check_attempt,
    deployment_from_request,
    team_quota_from_proto,
)
from trainforge_services.lcm.replicas import LeaderLifecycle

log = logging.getLogger(__name__)
Ctx = grpc.ServicerContext


class LcmServicer(lcm_pb2_grpc.LifecycleManagerServicer):
    def __init__(self, lifecycle: LifecycleManager | LeaderLifecycle):
        self._lifecycle = lifecycle

    @handler
    def DeployJob(self, request: lcm_pb2.DeployJobRequest, context: Ctx) -> lcm_pb2.DeployJobResponse:
        job = deployment_from_request(request)
        return lcm_pb2.DeployJobResponse(handles=[str(h) for h in self._lifecycle.deploy(job)])

    @handler
    def KillJob(self, request: lcm_pb2.KillJobRequest, context: Ctx) -> lcm_pb2.KillJobResponse:
        check_job_id(request.job_id)
        if request.attempt:
            check_attempt(request.attempt)
        log.info("killing job %s%s%s", request.job_id, f" attempt {request.attempt}" if request.attempt else "",
                 f": {request.reason}" if request.reason else "")
        return lcm_pb2.KillJobResponse(killed=self._lifecycle.kill(request.job_id, request.attempt))

    @handler
    def HaltJob(self, request: lcm_pb2.LcmHaltJobRequest, context: Ctx) -> lcm_pb2.LcmHaltJobResponse:
        _to_attempt(request, "halting job %s attempt %d", self._lifecycle.halt)
        return lcm_pb2.LcmHaltJobResponse()

    @handler
    def OpenGate(self, request: lcm_pb2.OpenGateRequest, context: Ctx) -> lcm_pb2.OpenGateResponse:
        _to_attempt(request, "opening the gate of job %s (attempt %d)", self._lifecycle.open_gate)
        return lcm_pb2.OpenGateResponse()

    @handler
    def GrowJob(self, request: lcm_pb2.GrowJobRequest, context: Ctx) -> lcm_pb2.GrowJobResponse:
        check_job_id(request.job_id)
        check_attempt(request.attempt)
        if request.learners < 1:
            raise InvalidArgument(f"learners must be at least 1, not {request.learners}",
                                  details=[{"field": "learners", "message": "must be at least 1"}])
        return lcm_pb2.GrowJobResponse(granted=self._lifecycle.grow(request.job_id, request.attempt,
                                                                    request.learners))

    @handler
    def GetCapacity(self, request: lcm_pb2.GetCapacityRequest, context: Ctx) -> lcm_pb2.Capacity:
        cap = self._lifecycle.capacity()
        return lcm_pb2.Capacity(backend=cap.backend, max_learners=cap.max_learners,
                                total=common_pb2.Resources(gpus=cap.gpus, cpus=cap.cpus, memory=cap.memory),
                                network_policy=cap.network_policy)

    @handler
    def SyncTeam(self, request: lcm_pb2.SyncTeamRequest, context: Ctx) -> lcm_pb2.SyncTeamResponse:
        if not request.team:
            raise InvalidArgument("team is required", details=[{"field": "team", "message": "required"}])
        quota = team_quota_from_proto(request.quota, "quota")
        mirrored = self._lifecycle.sync_team(request.team, quota)
        if mirrored:
            log.info("team %s: quota brought in step with %s", request.team, quota.model_dump(exclude_none=True))
        return lcm_pb2.SyncTeamResponse(mirrored=mirrored)

    @handler
    def Health(self, request: lcm_pb2.LcmHealthRequest, context: Ctx) -> lcm_pb2.LcmHealthResponse:
        return lcm_pb2.LcmHealthResponse(status="ok")


def _to_attempt(request: lcm_pb2.LcmHaltJobRequest | lcm_pb2.OpenGateRequest, what: str,
                call: Callable[[str, int], None]) -> None:
    """Check the request's job and attempt, log `what` (a format taking them) and make the call."""
    check_job_id(request.job_id)
    check_attempt(request.attempt)
    log.info(what, request.job_id, request.attempt)
    call(request.job_id, request.attempt)

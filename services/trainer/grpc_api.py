"""The Trainer's gRPC face: messages in, services/trainer/job_service.py, messages out.

Nothing here decides anything. `job_to_proto` is the one place a stored job
becomes a `common_pb2.Job`, so every caller sees history and learners in the
same order; `quota_from_proto` / `usage_to_proto` do the same for quotas,
where an unset optional field means "no limit" and must stay unset. Domain
errors become status codes in `rpc.handler` (the stores already turned a
MongoDB outage into `Unavailable`, so it is UNAVAILABLE on the wire).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import grpc

from trainforge_protos import common_pb2, trainer_pb2, trainer_pb2_grpc
from trainforge_services.common.errors import InvalidArgument, Unavailable
from trainforge_services.common.rpc import handler
from trainforge_services.common.rpcauth import caller
from trainforge_services.common.states import JobState
from trainforge_services.common.storeaccess import Publication
from trainforge_services.trainer.accounting import ClusterView, TeamReport
from trainforge_services.trainer.experiments.service import ExperimentService
from trainforge_services.trainer.experiments.wire import experiment_to_proto, view_to_proto, workflow_to_proto
from trainforge_services.trainer.experiments.workflows import WorkflowService
from trainforge_services.trainer.job_service import JobService
from trainforge_services.trainer.record import JobRecord, LearnerReport
from trainforge_services.trainer.resources import Limits, Quota, Usage

Ctx = grpc.ServicerContext
_BORROWABLE = ("gpus", "cpus", "memory")


def publication_to_proto(pub: Publication) -> trainer_pb2.Publication:
    return trainer_pb2.Publication(prefix=pub.uri, teams=sorted(pub.teams))


def job_to_proto(job: JobRecord) -> common_pb2.Job:
    """A job as the wire sees it: history oldest first, learners by rank, times in unix seconds."""
    history = [
        common_pb2.StatusEvent(from_state=int(e.from_state), to_state=int(e.to_state), reason=e.reason,
                               actor=e.actor, timestamp=e.ts,
                               borrowed=common_pb2.Resources(gpus=e.borrowed.gpus, cpus=e.borrowed.cpus,
                                                             memory=e.borrowed.memory)
                               if e.borrowed != Usage() else None,
                               grown=common_pb2.Resources(gpus=e.grown.gpus, cpus=e.grown.cpus, memory=e.grown.memory)
                               if e.grown is not None else None)
        for e in job.history
    ]
    learners = [
        common_pb2.LearnerStatus(rank=s.rank, state=s.state, exit_code=s.exit_code, attempt=s.attempt,
                                 message=s.message, isolation=s.isolation, timed_out=s.timed_out)
        for s in sorted(job.learners.values(), key=lambda s: s.rank)
    ]
    return common_pb2.Job(
        id=job.id, team=job.team, name=job.name, state=int(job.state), reason=job.reason,
        queue_position=job.queue_position, manifest_json=json.dumps(job.manifest), code_uri=job.code_uri,
        attempt=job.attempt, history=history, learners=learners, created_at=job.created_at,
        updated_at=job.updated_at, outputs_uri=job.outputs_uri, submitted_by=job.submitted_by,
        restarts=job.restarts, not_before=job.not_before, checkpoint_step=job.checkpoint_step,
        borrowed=_borrowed(job), preemptions=job.preemptions, preempted=job.preempted,
    )


def _borrowed(job: JobRecord) -> common_pb2.Borrowed | None:
    b = job.borrowed
    if b == Usage():
        return None
    return common_pb2.Borrowed(cohort=job.cohort, gpus=b.gpus, cpus=b.cpus, memory=b.memory)


def learners_from_proto(learners: Iterable[common_pb2.LearnerStatus]) -> dict[str, LearnerReport]:
    """Reported learner statuses keyed by rank (a string: the stored record keys them so)."""
    return {
        str(s.rank): LearnerReport(rank=s.rank, state=int(s.state), exit_code=s.exit_code, attempt=s.attempt,
                                   message=s.message, isolation=s.isolation, timed_out=s.timed_out)
        for s in learners
    }


def quota_from_proto(quota: trainer_pb2.Quota) -> Quota:
    """Only the limits the sender set; proto3 `optional` tells an unset field from a zero."""
    def limit(name: str) -> int | float | None:
        return getattr(quota, name) if quota.HasField(name) else None

    def limits(msg: trainer_pb2.ResourceLimits) -> Limits:
        return Limits(**{name: getattr(msg, name) for name in _BORROWABLE if msg.HasField(name)})

    return Quota(gpus=limit("gpus"), cpus=limit("cpus"), memory=limit("memory"), jobs=limit("jobs"),
                 gpus_by_type=dict(quota.gpus_by_type), cohort=quota.cohort,
                 lending_limit=limits(quota.lending_limit), borrowing_limit=limits(quota.borrowing_limit), egress=limit("egress"))


def quota_to_proto(quota: Quota) -> trainer_pb2.Quota:
    def set_only(obj: object, names: Iterable[str]) -> dict:
        return {name: getattr(obj, name) for name in names if getattr(obj, name) is not None}

    limits = {kind: trainer_pb2.ResourceLimits(**given) for kind in ("lending_limit", "borrowing_limit")
              if (given := set_only(getattr(quota, kind), _BORROWABLE))}
    return trainer_pb2.Quota(**set_only(quota, ("gpus", "cpus", "memory", "jobs", "egress")),
                             gpus_by_type=dict(quota.gpus_by_type), cohort=quota.cohort, **limits)


def usage_to_proto(report: TeamReport) -> trainer_pb2.TeamUsage:
    held = report.held
    in_use = trainer_pb2.Quota(gpus=held.usage.gpus, cpus=held.usage.cpus, memory=held.usage.memory,
                               jobs=held.jobs, gpus_by_type=dict(held.gpus_by_type))
    b = report.borrowed
    return trainer_pb2.TeamUsage(team=report.team, quota=quota_to_proto(report.quota), in_use=in_use,
                                 queued_jobs=report.queued_jobs, active_jobs=report.active_jobs,
                                 gpu_seconds=report.gpu_seconds, cpu_seconds=report.cpu_seconds,
                                 borrowed=trainer_pb2.Quota(gpus=b.gpus, cpus=b.cpus, memory=b.memory))


def cluster_to_proto(view: ClusterView) -> trainer_pb2.Cluster:
    def amounts(u: Usage) -> trainer_pb2.Quota:
        return trainer_pb2.Quota(gpus=u.gpus, cpus=u.cpus, memory=u.memory, jobs=u.learners)

    cap = view.capacity
    return trainer_pb2.Cluster(backend=cap.backend if cap else "", unknown_reason=view.unknown_reason,
                               capacity=amounts(cap.total) if cap else None, held=amounts(view.held),
                               active_jobs=view.active_jobs, queued_jobs=view.queued_jobs,
                               network_policy=cap.network_policy if cap else "")


def job_state(value: int, field: str) -> JobState:
    try:
        return JobState(value)
    except ValueError:
        raise InvalidArgument(f"{field}: {value} is not a job state",
                              details=[{"field": field, "message": "unknown job state"}]) from None


class TrainerServicer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self, service: JobService, experiments: ExperimentService | None = None,
                 workflows: WorkflowService | None = None):
        self._service = service
        self._experiments = experiments
        self._workflows = workflows

    def _exp(self) -> ExperimentService:
        if self._experiments is None:
            raise Unavailable("experiments are not served by this Trainer")
        return self._experiments

    @handler
    def SubmitJob(self, request: trainer_pb2.SubmitJobRequest, context: Ctx) -> common_pb2.Job:
        job = self._service.submit(request.team, request.manifest_json, code_uri=request.code_uri,
                                   submitted_by=request.submitted_by, job_id=request.job_id,
                                   idempotency_key=request.idempotency_key)
        return job_to_proto(job)

    @handler
    def GetJob(self, request: trainer_pb2.GetJobRequest, context: Ctx) -> common_pb2.Job:
        return job_to_proto(self._service.get(request.team, request.job_id))

    @handler
    def ListJobs(self, request: trainer_pb2.ListJobsRequest, context: Ctx) -> trainer_pb2.ListJobsResponse:
        wanted = [job_state(s, "states") for s in request.states]
        before = (request.before_created_at, request.before_id) if request.before_id else None
        jobs = self._service.list(request.team, states_filter=wanted, limit=request.limit, name=request.name,
                                  created_after=request.created_after, created_before=request.created_before,
                                  before=before, changed_after=request.changed_after)
        return trainer_pb2.ListJobsResponse(jobs=[job_to_proto(j) for j in jobs.jobs], as_of=jobs.as_of)

    @handler
    def CancelJob(self, request: trainer_pb2.CancelJobRequest, context: Ctx) -> common_pb2.Job:
        return job_to_proto(self._service.cancel(request.team, request.job_id, request.actor))

    @handler
    def HaltJob(self, request: trainer_pb2.HaltJobRequest, context: Ctx) -> common_pb2.Job:
        return job_to_proto(self._service.halt(request.team, request.job_id, request.actor))

    @handler
    def ResumeJob(self, request: trainer_pb2.ResumeJobRequest, context: Ctx) -> common_pb2.Job:
        return job_to_proto(self._service.resume(request.team, request.job_id, request.actor))

    @handler
    def ReportJobStatus(self, request: trainer_pb2.ReportJobStatusRequest, context: Ctx) -> common_pb2.Job:
        state = job_state(request.state, "state")
        learners = learners_from_proto(request.learners)
        job = self._service.report(request.job_id, request.attempt, state, request.reason, request.actor,
                                   learners=learners, outputs_uri=request.outputs_uri,
                                   checkpoint_step=request.checkpoint_step
                                   if request.HasField("checkpoint_step") else None,
                                   by_job=caller().is_job)
        return job_to_proto(job)

    @handler
    def Health(self, request: trainer_pb2.HealthRequest, context: Ctx) -> trainer_pb2.HealthResponse:
        return trainer_pb2.HealthResponse(status=self._service.health())

    @handler
    def SetQuota(self, request: trainer_pb2.SetQuotaRequest, context: Ctx) -> trainer_pb2.TeamUsage:
        report = self._service.set_quota(request.team, quota_from_proto(request.quota), request.actor)
        return usage_to_proto(report)

    @handler
    def GetTeamUsage(self, request: trainer_pb2.GetTeamUsageRequest, context: Ctx) -> trainer_pb2.TeamUsage:
        return usage_to_proto(self._service.team_usage(request.team))

    @handler
    def ListUsage(self, request: trainer_pb2.ListUsageRequest, context: Ctx) -> trainer_pb2.ListUsageResponse:
        return trainer_pb2.ListUsageResponse(teams=[usage_to_proto(r) for r in self._service.list_usage()])

    @handler
    def GetCluster(self, request: trainer_pb2.GetClusterRequest, context: Ctx) -> trainer_pb2.Cluster:
        return cluster_to_proto(self._service.cluster())

    @handler
    def SetPublication(self, request: trainer_pb2.SetPublicationRequest, context: Ctx) -> trainer_pb2.Publication:
        publications = self._service.refs.publications
        if not request.teams:
            publications.remove(request.prefix)
            return trainer_pb2.Publication(prefix=request.prefix)
        return publication_to_proto(publications.put(request.prefix, request.teams, request.actor or "admin"))

    @handler
    def ListPublications(self, request: trainer_pb2.ListPublicationsRequest,
                         context: Ctx) -> trainer_pb2.ListPublicationsResponse:
        return trainer_pb2.ListPublicationsResponse(
            publications=[publication_to_proto(p) for p in self._service.refs.publications.all()])

    # -- experiments --------------------------------------------------------

    @handler
    def SubmitExperiment(self, request: trainer_pb2.SubmitExperimentRequest, context: Ctx) -> trainer_pb2.Experiment:
        return view_to_proto(self._exp().submit(request.team, request.recipe, code_uri=request.code_uri,
                                                submitted_by=request.submitted_by,
                                                experiment_id=request.experiment_id))

    @handler
    def GetExperiment(self, request: trainer_pb2.GetExperimentRequest, context: Ctx) -> trainer_pb2.Experiment:
        return view_to_proto(self._exp().get(request.team, request.experiment_id))

    @handler
    def ListExperiments(self, request: trainer_pb2.ListExperimentsRequest,
                        context: Ctx) -> trainer_pb2.ListExperimentsResponse:
        found = self._exp().list(request.team, request.limit)
        return trainer_pb2.ListExperimentsResponse(experiments=[experiment_to_proto(e) for e in found])

    @handler
    def CancelExperiment(self, request: trainer_pb2.ExperimentAction, context: Ctx) -> trainer_pb2.Experiment:
        return view_to_proto(self._exp().cancel(request.team, request.experiment_id, request.actor))

    @handler
    def HaltExperiment(self, request: trainer_pb2.ExperimentAction, context: Ctx) -> trainer_pb2.Experiment:
        return view_to_proto(self._exp().halt(request.team, request.experiment_id, request.actor))

    @handler
    def ResumeExperiment(self, request: trainer_pb2.ExperimentAction, context: Ctx) -> trainer_pb2.Experiment:
        return view_to_proto(self._exp().resume(request.team, request.experiment_id, request.actor))

    # -- workflows ----------------------------------------------------------

    def _wf(self) -> WorkflowService:
        if self._workflows is None:
            raise Unavailable("workflows are not served by this Trainer")
        return self._workflows

    @handler
    def SubmitWorkflow(self, request: trainer_pb2.SubmitWorkflowRequest, context: Ctx) -> trainer_pb2.Workflow:
        wf = self._wf().submit(request.team, request.recipe, code_uri=request.code_uri,
                               submitted_by=request.submitted_by, workflow_id=request.workflow_id)
        return workflow_to_proto(wf, self._wf().nodes(wf))

    @handler
    def GetWorkflow(self, request: trainer_pb2.GetWorkflowRequest, context: Ctx) -> trainer_pb2.Workflow:
        wf = self._wf().get(request.team, request.workflow_id)
        return workflow_to_proto(wf, self._wf().nodes(wf))

    @handler
    def ListWorkflows(self, request: trainer_pb2.ListWorkflowsRequest, context: Ctx) -> trainer_pb2.ListWorkflowsResponse:
        return trainer_pb2.ListWorkflowsResponse(
            workflows=[workflow_to_proto(w) for w in self._wf().list(request.team, request.limit)])

    @handler
    def CancelWorkflow(self, request: trainer_pb2.WorkflowAction, context: Ctx) -> trainer_pb2.Workflow:
        wf = self._wf().cancel(request.team, request.workflow_id, request.actor)
        return workflow_to_proto(wf, self._wf().nodes(wf))

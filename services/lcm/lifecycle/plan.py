"""From a validated deploy request to the attempt plan a backend launches.

`JobDeployment` (in `backends/base.py`, the base of the plan) is the request
in the LCM's terms (the manifest parsed once, the job id checked against the
platform's rule), made in exactly one place (`deployment_from_request`). `build_plan` decides everything else about the attempt,
once: each rank's `LearnerSpec` (workdir, rendezvous, its GPUs) and the
`MonitorSpec`. A backend never re-derives any of it.
"""

from __future__ import annotations

from pydantic import ValidationError

from trainforge_protos import lcm_pb2
from trainforge_services.common.contracts.ids import check_job_id
from trainforge_services.common.contracts.specs import LearnerSpec, MonitorSpec, problems
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.lcm.backends.base import AttemptPlan, JobDeployment, Site, TeamQuota


def check_attempt(attempt: int) -> int:
    if attempt < 1:
        raise InvalidArgument(f"attempt must be 1 or more, got {attempt}",
                              details=[{"field": "attempt", "message": "must be 1 or more"}])
    return attempt


def deployment_from_request(request: lcm_pb2.DeployJobRequest) -> JobDeployment:
    """Validate a DeployJobRequest; InvalidArgument names the field at fault."""
    check_job_id(request.job_id)
    if not request.team:
        raise InvalidArgument("team is required", details=[{"field": "team", "message": "required"}])
    check_attempt(request.attempt)
    if not request.manifest_json:
        raise InvalidArgument("manifest_json is required",
                              details=[{"field": "manifest_json", "message": "required"}])
    return JobDeployment(job_id=request.job_id, team=request.team, attempt=request.attempt,
                         manifest=parse_manifest(request.manifest_json), code_uri=request.code_uri,
                         checkpoint_uri=request.checkpoint_uri, secret_env=dict(request.secret_env),
                         team_quota=team_quota_from_request(request), gated=request.gated,
                         reads=tuple(request.reads))


def team_quota_from_request(request: lcm_pb2.DeployJobRequest) -> TeamQuota | None:
    """The team's quota the Trainer sent (None when it sent none); InvalidArgument names a bad field."""
    if not request.HasField("team_quota"):
        return None
    return team_quota_from_proto(request.team_quota)


def team_quota_from_proto(q: lcm_pb2.TeamQuota, field: str = "team_quota") -> TeamQuota:
    """A TeamQuota message as the model; InvalidArgument names `field` when a limit is invalid."""
    limits = {f: getattr(q, f) for f in ("gpus", "cpus", "memory", "jobs", "egress") if q.HasField(f)}
    try:
        return TeamQuota(**limits, gpus_by_type=dict(q.gpus_by_type))
    except ValidationError as e:
        raise InvalidArgument(f"invalid {field}: {problems(e)}",
                              details=[{"field": field, "message": problems(e)}]) from None


def build_plan(job: JobDeployment, site: Site, gpus: list[int], *, lease_ttl: int,
               start_timeout: float, size: int | None = None) -> AttemptPlan:
    """The attempt's plan: rank r gets the r-th slice of `gpus` (the manifest's GPUs per learner each).

    `size` is how many learners start: the job's count, or for an elastic job
    what fits (lifecycle/elastic.py); an elastic learner's `world_size` is the
    job's maximum (ranks are its slots; torchrun numbers the group).
    """
    size = job.world_size if size is None else size
    per = job.manifest.resources.gpus
    gpu_ids = tuple(tuple(gpus[r * per:(r + 1) * per]) for r in range(size))
    world = job.manifest.max_learners if job.manifest.elastic else size
    learners = tuple(
        LearnerSpec(job_id=job.job_id, team=job.team, attempt=job.attempt, rank=rank, world_size=world,
                    manifest=job.manifest, code_uri=job.code_uri, checkpoint_uri=job.checkpoint_uri,
                    workdir=site.attempt_dir / f"learner-{rank}", master_addr=site.master_addr,
                    master_port=site.master_port, gpu_ids=list(gpu_ids[rank]), lease_ttl=lease_ttl,
                    secret_env=job.secret_env, gated=job.gated, reads=list(job.reads),
                    egress=(job.team_quota.egress or "") if job.team_quota else "")
        for rank in range(size))
    elastic = {"min_learners": job.manifest.min_learners, "max_learners": job.manifest.max_learners} \
        if job.manifest.elastic else {}
    monitor = MonitorSpec(job_id=job.job_id, team=job.team, attempt=job.attempt, learners=size,
                          start_timeout=start_timeout, **elastic)
    return AttemptPlan(**dict(job), attempt_dir=site.attempt_dir,
                       master_addr=site.master_addr, master_port=site.master_port, gpu_ids=gpu_ids,
                       learners=learners, monitor=monitor)


def with_learners(plan: AttemptPlan, gpus_by_rank: dict[int, list[int]]) -> AttemptPlan:
    """An elastic plan with the slots of `gpus_by_rank` (re)specified: a slot started before keeps its spec
    with these GPUs, a new one (the next ranks, in order) is made like slot 0's."""
    learners = list(plan.learners)
    gpu_ids = list(plan.gpu_ids)
    for rank in sorted(gpus_by_rank):
        if rank > len(learners) or rank >= plan.manifest.max_learners:
            raise InvalidArgument(f"job {plan.job_id}: slot {rank} is not the next of {len(learners)} slots "
                                  f"(at most {plan.manifest.max_learners})")
        spec = learners[0].model_copy(update={"rank": rank, "workdir": plan.attempt_dir / f"learner-{rank}",
                                              "gpu_ids": list(gpus_by_rank[rank])})
        if rank == len(learners):
            learners.append(spec)
            gpu_ids.append(tuple(gpus_by_rank[rank]))
        else:
            learners[rank] = spec
            gpu_ids[rank] = tuple(gpus_by_rank[rank])
    return plan.model_copy(update={"learners": tuple(learners), "gpu_ids": tuple(gpu_ids)})

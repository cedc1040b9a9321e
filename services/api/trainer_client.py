"""The API's view of the Trainer: a small interface, the gRPC client, and the REST job shape.

Routes depend on `TrainerApi`, never on gRPC, so tests (and a dashboard
developer) can run the API against `InMemoryTrainer` (tests/fakes/trainer_memory.py). This is also
the one place where states turn into lowercase names: inside the platform
they are enum members; at the REST boundary they are "running", "queued".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Protocol

from trainforge_protos import common_pb2, trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import rpc
from trainforge_services.common.isolation import NOT_ISOLATED, Isolation
from trainforge_services.common.states import LEARNER_EXITED, LEARNER_STARTED, JobState, LearnerState


class TrainerApi(Protocol):
    """What the API needs from the Trainer; every method returns REST-shaped dicts."""

    def submit_job(self, *, team: str, manifest_json: str, code_uri: str, submitted_by: str,
                   job_id: str) -> dict: ...

    def get_job(self, team: str, job_id: str) -> dict: ...

    def list_jobs(self, team: str, *, limit: int = 50, states: Iterable[JobState] = (), name: str = "",
                  created_after: float = 0.0, created_before: float = 0.0,
                  before: tuple[float, str] | None = None) -> list[dict]: ...

    def list_jobs_as_of(self, team: str, *, changed_after: float = 0.0, limit: int = 50,
                        states: Iterable[JobState] = (), name: str = "", created_after: float = 0.0,
                        created_before: float = 0.0,
                        before: tuple[float, str] | None = None) -> tuple[list[dict], float]:
        """`list_jobs`, only the jobs changed at or after `changed_after` (0: all), with the listing's `as_of`:
        the time to pass as `changed_after` next so that no change is missed."""
        ...

    def cancel_job(self, team: str, job_id: str, *, actor: str) -> dict: ...

    def halt_job(self, team: str, job_id: str, *, actor: str) -> dict: ...

    def resume_job(self, team: str, job_id: str, *, actor: str) -> dict: ...

    def set_quota(self, team: str, quota: dict, *, actor: str) -> dict: ...

    def team_usage(self, team: str) -> dict: ...

    def list_usage(self) -> list[dict]: ...

    def cluster(self) -> dict: ...

    def set_publication(self, prefix: str, teams: list[str], *, actor: str) -> dict: ...

    def publications(self) -> list[dict]: ...

    def health(self) -> str: ...

    def close(self) -> None: ...


QUOTA_LIMITS = ("gpus", "cpus", "memory", "jobs")
BORROWABLE = ("gpus", "cpus", "memory")


def job_state_name(state: int) -> str:
    return "unspecified" if state == 0 else JobState(state).name.lower()


def learner_state_name(state: int) -> str:
    return "unspecified" if state == 0 else LearnerState(state).name.removeprefix("LEARNER_").lower()


def learner_to_json(ls: common_pb2.LearnerStatus) -> dict:
    # proto3 cannot tell "exit code 0" from "not exited"; only states after
    # the learner's exit carry one.
    exited = ls.state in LEARNER_EXITED
    return {"rank": ls.rank, "state": learner_state_name(ls.state),
            "exit_code": ls.exit_code if exited else None, "attempt": ls.attempt, "message": ls.message,
            "isolation": ls.isolation, **({"warning": NOT_ISOLATED} if ls.isolation == Isolation.NONE else {})}


def job_to_json(job: common_pb2.Job) -> dict:
    """A Job message in the REST shape of docs/CONTRACTS.md."""
    return {
        "id": job.id,
        "team": job.team,
        "name": job.name,
        "state": job_state_name(job.state),
        "reason": job.reason,
        "queue_position": job.queue_position,
        "attempt": job.attempt,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "learners": [learner_to_json(ls) for ls in sorted(job.learners, key=lambda x: x.rank)],
        "history": [{"from": job_state_name(ev.from_state), "to": job_state_name(ev.to_state),
                     "reason": ev.reason, "actor": ev.actor, "timestamp": ev.timestamp,
                     "borrowed": resources_json(ev.borrowed) if ev.HasField("borrowed") else None,
                     "grown": resources_json(ev.grown) if ev.HasField("grown") else None}
                    for ev in job.history],
        "manifest": json.loads(job.manifest_json) if job.manifest_json else {},
        "outputs_uri": job.outputs_uri,
        "submitted_by": job.submitted_by,
        "restarts": job.restarts,
        "checkpoint_step": job.checkpoint_step if job.HasField("checkpoint_step") else None,
        "not_before": job.not_before,
        "borrowed": ({"cohort": job.borrowed.cohort, "gpus": job.borrowed.gpus, "cpus": job.borrowed.cpus,
                      "memory": job.borrowed.memory} if job.HasField("borrowed") else None),
        "preemptions": job.preemptions,
        "preempted": job.preempted,
        "world_size": world_size_json(job),
    }


def resources_json(r: common_pb2.Resources) -> dict:
    return {"gpus": r.gpus, "cpus": r.cpus, "memory": r.memory}


def world_size_json(job: common_pb2.Job) -> dict | None:
    """An elastic job's size (docs/CONTRACTS.md): learners running (`current`) and learners the platform
    runs or is starting for it (`target`), within the manifest's {min, max}; None for a fixed-size job."""
    manifest = json.loads(job.manifest_json) if job.manifest_json else {}
    bounds = manifest.get("learners")
    if not isinstance(bounds, dict):
        return None
    states = [ls.state for ls in job.learners if ls.attempt == job.attempt]
    out = (LearnerState.LEARNER_STATE_UNSPECIFIED, LearnerState.LEARNER_FAILED)
    return {"current": sum(s in LEARNER_STARTED for s in states), "target": sum(s not in out for s in states),
            "min": bounds.get("min"), "max": bounds.get("max")}


def quota_to_json(quota: trainer_pb2.Quota) -> dict:
    """A Quota message as {gpus, cpus, memory, jobs, gpus_by_type}; an unset limit is None."""
    out: dict = {name: (getattr(quota, name) if quota.HasField(name) else None) for name in QUOTA_LIMITS}
    out["gpus_by_type"] = dict(sorted(quota.gpus_by_type.items()))
    out["cohort"] = quota.cohort
    for kind in ("lending_limit", "borrowing_limit"):
        limits = getattr(quota, kind)
        out[kind] = {name: (getattr(limits, name) if limits.HasField(name) else None) for name in BORROWABLE} \
            if quota.HasField(kind) and any(limits.HasField(n) for n in BORROWABLE) else None
    out["egress"] = quota.egress if quota.HasField("egress") else None
    return out


def quota_to_proto(quota: dict) -> trainer_pb2.Quota:
    limits = {name: quota[name] for name in (*QUOTA_LIMITS, "egress") if quota.get(name) is not None}

    def resource_limits(kind: str) -> trainer_pb2.ResourceLimits:
        given = quota.get(kind) or {}
        return trainer_pb2.ResourceLimits(**{n: given[n] for n in BORROWABLE if given.get(n) is not None})

    return trainer_pb2.Quota(**limits, gpus_by_type=dict(quota.get("gpus_by_type") or {}),
                             cohort=quota.get("cohort") or "", lending_limit=resource_limits("lending_limit"),
                             borrowing_limit=resource_limits("borrowing_limit"))


def usage_to_json(usage: trainer_pb2.TeamUsage) -> dict:
    return {"team": usage.team, "quota": quota_to_json(usage.quota), "in_use": quota_to_json(usage.in_use),
            "queued_jobs": usage.queued_jobs, "active_jobs": usage.active_jobs,
            "gpu_seconds": usage.gpu_seconds, "cpu_seconds": usage.cpu_seconds,
            "borrowed": {"gpus": usage.borrowed.gpus, "cpus": usage.borrowed.cpus, "memory": usage.borrowed.memory}}


def cluster_to_json(c: trainer_pb2.Cluster) -> dict:
    def amounts(q: trainer_pb2.Quota) -> dict:
        return {"gpus": q.gpus, "cpus": q.cpus, "memory": q.memory, "learners": q.jobs}

    known = c.HasField("capacity")
    capacity, held = (amounts(c.capacity) if known else None), amounts(c.held)
    free = {k: max(0, capacity[k] - held[k]) for k in capacity} if capacity else None
    return {"backend": c.backend, "known": known, "unknown_reason": c.unknown_reason, "capacity": capacity,
            "held": held, "free": free, "active_jobs": c.active_jobs, "queued_jobs": c.queued_jobs,
            "network_policy": c.network_policy}


class TrainerClient:
    """TrainerApi over gRPC; failures come back as domain errors (trainforge_services.common.errors)."""

    def __init__(self, address: str, *, timeout: float = 30.0, health_timeout: float = 3.0,
                 authorization: str | Callable[[], str] = ""):
        """`authorization`: the service credential sent with every call (common/rpcauth.py)."""
        self.address = address
        self._timeout = timeout
        self._health_timeout = health_timeout
        self._channel = rpc.channel(address, authorization=authorization)
        self._stub = trainer_pb2_grpc.TrainerStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def submit_job(self, *, team: str, manifest_json: str, code_uri: str, submitted_by: str,
                   job_id: str) -> dict:
        req = trainer_pb2.SubmitJobRequest(team=team, manifest_json=manifest_json, code_uri=code_uri,
                                           submitted_by=submitted_by, job_id=job_id)
        return job_to_json(rpc.call(self._stub.SubmitJob, req, self._timeout))

    def get_job(self, team: str, job_id: str) -> dict:
        req = trainer_pb2.GetJobRequest(team=team, job_id=job_id)
        return job_to_json(rpc.call(self._stub.GetJob, req, self._timeout))

    def list_jobs(self, team: str, *, limit: int = 50, states: Iterable[JobState] = (), name: str = "",
                  created_after: float = 0.0, created_before: float = 0.0,
                  before: tuple[float, str] | None = None) -> list[dict]:
        return self.list_jobs_as_of(team, limit=limit, states=states, name=name, created_after=created_after,
                                    created_before=created_before, before=before)[0]

    def list_jobs_as_of(self, team: str, *, changed_after: float = 0.0, limit: int = 50,
                        states: Iterable[JobState] = (), name: str = "", created_after: float = 0.0,
                        created_before: float = 0.0,
                        before: tuple[float, str] | None = None) -> tuple[list[dict], float]:
        req = trainer_pb2.ListJobsRequest(team=team, limit=limit, states=[int(s) for s in states], name=name,
                                          created_after=created_after, created_before=created_before,
                                          before_created_at=before[0] if before else 0.0,
                                          before_id=before[1] if before else "", changed_after=changed_after)
        resp = rpc.call(self._stub.ListJobs, req, self._timeout)
        return [job_to_json(j) for j in resp.jobs], resp.as_of

    def cancel_job(self, team: str, job_id: str, *, actor: str) -> dict:
        req = trainer_pb2.CancelJobRequest(team=team, job_id=job_id, actor=actor)
        return job_to_json(rpc.call(self._stub.CancelJob, req, self._timeout))

    def halt_job(self, team: str, job_id: str, *, actor: str) -> dict:
        req = trainer_pb2.HaltJobRequest(team=team, job_id=job_id, actor=actor)
        return job_to_json(rpc.call(self._stub.HaltJob, req, self._timeout))

    def resume_job(self, team: str, job_id: str, *, actor: str) -> dict:
        req = trainer_pb2.ResumeJobRequest(team=team, job_id=job_id, actor=actor)
        return job_to_json(rpc.call(self._stub.ResumeJob, req, self._timeout))

    def set_quota(self, team: str, quota: dict, *, actor: str) -> dict:
        req = trainer_pb2.SetQuotaRequest(team=team, quota=quota_to_proto(quota), actor=actor)
        return usage_to_json(rpc.call(self._stub.SetQuota, req, self._timeout))

    def team_usage(self, team: str) -> dict:
        req = trainer_pb2.GetTeamUsageRequest(team=team)
        return usage_to_json(rpc.call(self._stub.GetTeamUsage, req, self._timeout))

    def list_usage(self) -> list[dict]:
        resp = rpc.call(self._stub.ListUsage, trainer_pb2.ListUsageRequest(), self._timeout)
        return [usage_to_json(u) for u in resp.teams]

    def cluster(self) -> dict:
        return cluster_to_json(rpc.call(self._stub.GetCluster, trainer_pb2.GetClusterRequest(), self._timeout))

    def set_publication(self, prefix: str, teams: list[str], *, actor: str) -> dict:
        req = trainer_pb2.SetPublicationRequest(prefix=prefix, teams=teams, actor=actor)
        p = rpc.call(self._stub.SetPublication, req, self._timeout)
        return {"prefix": p.prefix, "teams": list(p.teams)}

    def publications(self) -> list[dict]:
        resp = rpc.call(self._stub.ListPublications, trainer_pb2.ListPublicationsRequest(), self._timeout)
        return [{"prefix": p.prefix, "teams": list(p.teams)} for p in resp.publications]

    def health(self) -> str:
        return rpc.call(self._stub.Health, trainer_pb2.HealthRequest(), self._health_timeout).status

"""What fits where, in which order, and the words a user reads when it does not.

Admission is pure arithmetic over resource totals so it can be tested without
a store or a backend. Two kinds of limit apply to a queued job: the backend's
capacity (shared by everyone) and its team's quota (gpus, cpus, memory,
concurrent jobs, GPUs per type; an unset limit is no limit). The dispatcher
feeds `plan` the queue, what ACTIVE jobs hold in total and per team, and the
quotas; it answers which jobs to dispatch, which wait (with a reason naming
the resource and the limit, and a position in their team's queue) and which
can never run (bigger than the backend or than their team's whole quota).

Order (`plan`): priority first; within a priority level, teams take turns by
least current use: the team whose dominant share (its largest fraction of
any one resource of the backend, as in Dominant Resource Fairness) is
smallest offers its oldest waiting job next, and its share grows with every
job it is given. Ties go to the team whose oldest waiting job is older. So a
team that floods the queue cannot push another team's job behind its own
backlog: the other team, holding less, is next at the first free slot. Within
a team it is first come, first served. A job that does not fit does not stop
the walk (backfill): later, smaller jobs may still go, so the backend is
never idle while something it could run is queued.

The values it reads and answers with (`Usage`, `Quota`, `Queued`, ...) are
services/trainer/resources.py; this module holds only the policy.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from trainforge_services.common.manifest import Manifest
from trainforge_services.trainer.resources import NO_QUOTA, BackendSize, Queued, Quota, TeamUse, Usage

# Tolerance for sums of fractional CPUs (0.1 + 0.2 must fit in 0.3).
_EPS = 1e-9
_MEMORY_UNITS = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def total(usages: Iterable[Usage]) -> Usage:
    return sum(usages, Usage())


def demand(manifest: Manifest) -> Usage:
    """Everything a job holds while it is active: all of its learners together."""
    r, n = manifest.resources, manifest.min_learners  # an elastic job is admitted at its minimum
    return Usage(r.gpus * n, r.cpus * n, r.memory * n, n)


def format_memory(n: int) -> str:
    for suffix, unit in _MEMORY_UNITS:
        if n >= unit:
            return f"{n / unit:.4g}{suffix}"
    return f"{n}B"


def _amount(resource: str, value: float) -> str:
    if resource == "memory":
        return format_memory(int(value))
    return f"{value:g}"


def _needs(resource: str, value: float) -> str:
    if resource == "memory":
        return f"needs {format_memory(int(value))} of memory"
    noun = {"gpus": "GPU", "cpus": "CPU", "learners": "learner"}[resource]
    return f"needs {value:g} {noun}{'' if value == 1 else 's'}"


_RESOURCES = ("gpus", "cpus", "memory", "learners")


def _gpus_of(gpu_type: str, gpus: int) -> str:
    return f"{gpus} {gpu_type} GPU{'' if gpus == 1 else 's'}"


def too_big(need: Usage, capacity: BackendSize) -> dict[str, str]:
    """Why a job can never run on this backend, per resource; empty when an idle backend could run it."""
    problems = {}
    for resource in _RESOURCES:
        asked, has = getattr(need, resource), getattr(capacity.total, resource)
        if asked > has + _EPS:
            if resource == "learners":
                problems[resource] = f"{_needs(resource, asked)} but the backend runs at most {has:g} at once"
            else:
                problems[resource] = f"{_needs(resource, asked)} but the backend has {_amount(resource, has)}"
    return problems


def shortfall(need: Usage, limit: Usage, in_use: Usage, label: str = "capacity") -> str | None:
    """Why `need` does not fit in `limit` next to `in_use` ("needs 4 CPUs; capacity 2, in use 1.5")."""
    for resource in _RESOURCES:
        asked, cap, used = getattr(need, resource), getattr(limit, resource), getattr(in_use, resource)
        if asked and used + asked > cap + _EPS:
            return (f"{_needs(resource, asked)}; "
                    f"{label} {_amount(resource, cap)}, in use {_amount(resource, used)}")
    return None


def team_use(active: Iterable[tuple[str, Usage, str]]) -> dict[str, TeamUse]:
    """(team, job's need, job's gpu type) of every ACTIVE job -> what each team holds."""
    result: dict[str, TeamUse] = {}
    for team, need, gpu_type in active:
        result[team] = result.get(team, TeamUse()).add(need, gpu_type)
    return result


def beyond_quota(need: Usage, gpu_type: str, quota: Quota) -> dict[str, str]:
    """Why a job can never run under its team's whole quota, per field; empty when it could."""
    problems = {}
    if quota.gpus is not None and need.gpus > quota.gpus:
        problems["gpus"] = f"{_needs('gpus', need.gpus)} but team quota is {quota.gpus}"
    type_limit = quota.gpus_by_type.get(gpu_type) if gpu_type else None
    if type_limit is not None and need.gpus > type_limit:
        problems["gpu_type"] = (f"needs {_gpus_of(gpu_type, need.gpus)} "
                                f"but team quota for {gpu_type} is {type_limit}")
    for resource in ("cpus", "memory"):
        limit, asked = getattr(quota, resource), getattr(need, resource)
        if limit is not None and asked > limit + _EPS:
            problems[resource] = f"{_needs(resource, asked)} but team quota is {_amount(resource, limit)}"
    if quota.jobs is not None and quota.jobs < 1:
        problems["jobs"] = "team quota allows no running jobs"
    return problems


def over_quota(need: Usage, gpu_type: str, quota: Quota, use: TeamUse) -> str | None:
    """Why a job does not fit its team's quota beside what the team holds.

    E.g. "needs 2 GPUs; team quota 4, in use 4"; None when it fits.
    """
    if quota.gpus is not None and need.gpus and use.usage.gpus + need.gpus > quota.gpus:
        return f"{_needs('gpus', need.gpus)}; team quota {quota.gpus}, in use {use.usage.gpus}"
    type_limit = quota.gpus_by_type.get(gpu_type) if gpu_type else None
    if type_limit is not None and need.gpus:
        used = use.gpus_by_type.get(gpu_type, 0)
        if used + need.gpus > type_limit:
            return (f"needs {_gpus_of(gpu_type, need.gpus)}; "
                    f"team quota for {gpu_type} {type_limit}, in use {used}")
    for resource in ("cpus", "memory"):
        limit, asked, used = getattr(quota, resource), getattr(need, resource), getattr(use.usage, resource)
        if limit is not None and asked and used + asked > limit + _EPS:
            return (f"{_needs(resource, asked)}; "
                    f"team quota {_amount(resource, limit)}, in use {_amount(resource, used)}")
    if quota.jobs is not None and use.jobs + 1 > quota.jobs:
        return f"needs a job slot; team quota {quota.jobs} jobs, in use {use.jobs}"
    return None


def dominant_share(use: Usage, capacity: Usage) -> float:
    """The largest fraction of any one resource of the backend that `use` holds (0 when it holds nothing)."""
    shares = [getattr(use, r) / getattr(capacity, r) for r in _RESOURCES if getattr(capacity, r) > 0]
    return max(shares, default=0.0)


def queue_order(jobs: Iterable[Queued]) -> list[Queued]:
    """A team's own order (and the global one before fairness): higher priority first, then a preempted job
    requeued, then first come."""
    return sorted(jobs, key=lambda q: (-q.priority, not q.front, q.created_at, q.job_id))


def positions(jobs: Iterable[Queued]) -> dict[str, int]:
    """Each job's 1-based position in its own team's queue."""
    return {job.job_id: position for job, position in _positions(queue_order(jobs))}


@dataclass
class Plan:
    # in the order the jobs were given their resources
    dispatch: list[str] = field(default_factory=list)
    # job_id -> (reason, 1-based position in its team's queue)
    wait: dict[str, tuple[str, int]] = field(default_factory=dict)
    # job_id -> why it can never run here
    reject: dict[str, str] = field(default_factory=dict)
    # dispatched job_id -> what it holds beyond its team's own quota (borrowed in its cohort)
    borrowed: dict[str, Usage] = field(default_factory=dict)


# (job, what every team holds now) -> why it does not fit its team's quota (None: it does), and what it
# would borrow from the team's cohort; services/trainer/cohorts.py gives one that knows cohorts.
QuotaFit = Callable[[Queued, Mapping[str, TeamUse]], tuple[str | None, Usage]]


def reason_kind(reason: str) -> str:
    """A waiting reason's kind for the admission metrics: "quota", "lcm" or "capacity" (low cardinality)."""
    if "by preemption" in reason:
        return "preemption"
    if "team quota" in reason:
        return "quota"
    if reason.startswith("waiting for the LCM"):
        return "lcm"
    return "capacity"


def hold(queue: Sequence[Queued], reason: str) -> Plan:
    """Every job waits, for one reason (the backend's capacity is not known)."""
    return Plan(wait={job.job_id: (reason, position) for job, position in _positions(queue_order(queue))})


def plan(queue: Sequence[Queued], in_use: Usage, capacity: BackendSize, *,
         quotas: Mapping[str, Quota] | None = None, teams: Mapping[str, TeamUse] | None = None,
         fit: QuotaFit | None = None) -> Plan:
    """Offer every queued job its turn (see the module's docstring) and dispatch each one that fits.

    `in_use` is what all ACTIVE jobs hold, `teams` the same per team, and
    `quotas` each team's limits (a team without one has none). A job must
    fit both its team's quota and the backend's capacity. A smaller job may
    pass a larger one that waits, so a stream of small jobs can hold a large
    one back (holding room for the head of the queue would be the
    refinement). Waiting jobs' reasons are worded against the use after this
    pass, which is what the user will see running.

    `fit` checks a job against its team's quota (default: the team's own
    limits, nothing borrowed; with cohorts, `quotas` need only say what a
    team could ever hold, for refusals). A job that fits only by borrowing in its
    cohort is offered its turn after every job that fits without (as Kueue
    does), so an owner's job reclaims its own quota before a borrower's job
    can take it again.
    """
    quotas = quotas or {}
    held = dict(teams or {})
    if fit is None:
        def fit(job: Queued, held: Mapping[str, TeamUse]) -> tuple[str | None, Usage]:
            return (over_quota(job.need, job.gpu_type, quotas.get(job.team, NO_QUOTA),
                               held.get(job.team, TeamUse())), Usage())
    result = Plan()
    by_level: dict[int, dict[str, deque[Queued]]] = defaultdict(lambda: defaultdict(deque))
    ordered = queue_order(queue)
    never: dict[str, str] = {}  # why a kind of job can never run here ("": it can)
    for job in ordered:
        key = job.kind
        if (why := never.get(key)) is None:
            quota = quotas.get(job.team, NO_QUOTA)
            why = never[key] = "; ".join({**too_big(job.need, capacity),
                                          **beyond_quota(job.need, job.gpu_type, quota)}.values())
        if why:
            result.reject[job.job_id] = why
        else:
            by_level[job.priority][job.team].append(job)

    waiting: list[Queued] = []
    borrowing: list[Queued] = []
    checks = _Checks(fit, held, capacity.total, in_use)
    for priority in sorted(by_level, reverse=True):
        lines = by_level[priority]
        turns = [(checks.share(team), lines[team][0].created_at, team) for team in lines]
        heapq.heapify(turns)
        while turns:
            *_, team = heapq.heappop(turns)
            job = lines[team].popleft()
            problem, borrowed = checks.of(job)
            if problem:
                waiting.append(job)
            elif borrowed != Usage():
                borrowing.append(job)
            else:
                result.dispatch.append(job.job_id)
                checks.take(job)
            if lines[team]:
                heapq.heappush(turns, (checks.share(team), lines[team][0].created_at, team))
    for job in borrowing:  # in the order they were offered their turn
        problem, borrowed = checks.of(job)
        if problem:
            waiting.append(job)
            continue
        result.dispatch.append(job.job_id)
        if borrowed != Usage():
            result.borrowed[job.job_id] = borrowed
        checks.take(job)

    # use only grows during the walk, so what did not fit then does not fit now
    left = {job.job_id for job in waiting}
    for job, position in _positions(job for job in ordered if job.job_id in left):
        result.wait[job.job_id] = (checks.of(job)[0] or "waiting for room", position)
    return result


class _Checks:
    """Whether a job fits its quota and the capacity now, remembered per (team, need, GPU type) until the
    next reservation: with a long queue most jobs look alike, and nothing changes between reservations,
    so a pass asks the quota arithmetic once per kind of job and reservation, not once per job."""

    def __init__(self, fit: QuotaFit, held: dict[str, TeamUse], capacity: Usage, in_use: Usage):
        self._fit, self._held, self._capacity, self.in_use = fit, held, capacity, in_use
        self._seen: dict[str, tuple[str | None, Usage]] = {}
        self._shares: dict[str, float] = {}

    def share(self, team: str) -> float:
        """The team's dominant share (its turn's rank): it changes only when the team is given a job."""
        if (known := self._shares.get(team)) is None:
            known = self._shares[team] = dominant_share(self._held.get(team, TeamUse()).usage, self._capacity)
        return known

    def of(self, job: Queued) -> tuple[str | None, Usage]:
        """(why `job` waits, None if it fits; what it would borrow)."""
        key = job.kind
        if (known := self._seen.get(key)) is None:
            problem, borrowed = self._fit(job, self._held)
            problem = problem or shortfall(job.need, self._capacity, self.in_use)
            known = self._seen[key] = (problem, borrowed)
        return known

    def take(self, job: Queued) -> None:
        """Reserve `job`: what every team holds and the total change, so every answer may."""
        self.in_use = self.in_use + job.need
        self._held[job.team] = self._held.get(job.team, TeamUse()).add(job.need, job.gpu_type)
        self._seen.clear()
        self._shares.pop(job.team, None)


def _positions(ordered: Iterable[Queued]) -> Iterable[tuple[Queued, int]]:
    """Each job with its 1-based position in its own team's queue."""
    seen: dict[str, int] = {}
    for job in ordered:
        seen[job.team] = seen.get(job.team, 0) + 1
        yield job, seen[job.team]

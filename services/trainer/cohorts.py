"""Borrowing inside a cohort: what a team may hold beyond its own quota, in Kueue's terms.

Teams whose quotas name the same `cohort` lend each other what they leave
unused of their gpus, cpus and memory. Per resource, a member's nominal
quota N splits into what it lends (its `lending_limit`, or all of N when
unset) and what stays guaranteed to it (N minus that). The cohort's pool is
the sum of what its members lend; a member's use beyond its guaranteed part
is drawn from the pool. A job fits when its team's use stays within
N + `borrowing_limit` (no limit when unset) and the pool is not overdrawn.

So a team within its nominal quota whose lent quota is in use by others
does not fit: that is the owner reclaiming, which services/trainer/
preemption.py answers by halting the borrowers. A team without a limit on a
resource neither lends nor borrows it; the number of jobs and the per-type
GPU limits are never borrowed. Pure arithmetic, like admission.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from trainforge_services.trainer.admission import _EPS, _amount, _needs, over_quota
from trainforge_services.trainer.resources import NO_QUOTA, Queued, Quota, TeamUse, Usage

BORROWABLE = ("gpus", "cpus", "memory")


def _get(obj: object, resource: str) -> float | None:
    value = getattr(obj, resource)
    return None if value is None else float(value)


def describe(amount: Usage, quota: Quota | None = None) -> str:
    """'2 GPUs, 4 CPUs' of the borrowable resources in `amount`: those `quota` limits, when it limits any."""
    limited = [r for r in BORROWABLE if quota is not None and getattr(quota, r) is not None] or BORROWABLE
    parts = [_needs(r, getattr(amount, r)).removeprefix("needs ") for r in limited if getattr(amount, r)]
    return ", ".join(parts) or "nothing"


class Book:
    """What each team holds, against its quota and its cohort's pool; `fit` is admission's QuotaFit."""

    def __init__(self, quotas: Mapping[str, Quota], teams: Mapping[str, TeamUse]):
        self.quotas = quotas
        self.held: dict[str, TeamUse] = dict(teams)
        self._members: dict[str, list[str]] = {}
        for team, quota in quotas.items():
            if quota.cohort:
                self._members.setdefault(quota.cohort, []).append(team)

    def copy(self) -> Book:
        book = Book.__new__(Book)
        book.quotas, book.held, book._members = self.quotas, dict(self.held), self._members
        return book

    def quota(self, team: str) -> Quota:
        return self.quotas.get(team, NO_QUOTA)

    def use(self, team: str) -> TeamUse:
        return self.held.get(team, TeamUse())

    def add(self, team: str, need: Usage, gpu_type: str = "") -> None:
        self.held[team] = self.use(team).add(need, gpu_type)

    def remove(self, team: str, need: Usage, gpu_type: str = "") -> None:
        use = self.use(team)
        by_type = dict(use.gpus_by_type)
        if gpu_type and need.gpus:
            by_type[gpu_type] = by_type.get(gpu_type, 0) - need.gpus
        minus = Usage(-need.gpus, -need.cpus, -need.memory, -need.learners)
        self.held[team] = TeamUse(use.usage + minus, use.jobs - 1, by_type)

    # -- the cohort's arithmetic, per resource --------------------------------

    def _lends(self, team: str, resource: str) -> float:
        quota = self.quota(team)
        nominal, limit = _get(quota, resource), _get(quota.lending_limit, resource)
        if nominal is None:
            return 0.0
        return nominal if limit is None else min(limit, nominal)

    def _guaranteed(self, team: str, resource: str) -> float:
        return (_get(self.quota(team), resource) or 0.0) - self._lends(team, resource)

    def pool(self, cohort: str, resource: str) -> float:
        return sum(self._lends(t, resource) for t in self._members.get(cohort, ()))

    def _drawn(self, team: str, resource: str, extra: float = 0.0) -> float:
        if _get(self.quota(team), resource) is None:
            return 0.0
        used = getattr(self.use(team).usage, resource) + extra
        return max(0.0, used - self._guaranteed(team, resource))

    def pool_used(self, cohort: str, resource: str) -> float:
        return sum(self._drawn(t, resource) for t in self._members.get(cohort, ()))

    def borrowing(self, team: str) -> Usage:
        """What `team` holds beyond its own quota now (zero outside a cohort)."""
        quota = self.quota(team)
        if not quota.cohort:
            return Usage()
        over = {}
        for resource in BORROWABLE:
            nominal = _get(quota, resource)
            used = getattr(self.use(team).usage, resource)
            over[resource] = 0.0 if nominal is None else max(0.0, used - nominal)
        return Usage(int(over["gpus"]), over["cpus"], int(over["memory"]))

    def within_nominal(self, team: str, need: Usage) -> bool:
        """Whether `need` next to what `team` holds stays within its own quota (it then reclaims, never borrows)."""
        quota = self.quota(team)
        for resource in BORROWABLE:
            nominal = _get(quota, resource)
            if nominal is not None and getattr(self.use(team).usage, resource) + getattr(need, resource) \
                    > nominal + _EPS:
                return False
        return True

    def fit(self, job: Queued, held: Mapping[str, TeamUse] | None = None) -> tuple[str | None, Usage]:
        """Why `job` does not fit its team's quota and cohort (None: it does), and what it would borrow.

        `held`: what every team holds, when the caller keeps it (admission.plan does); it becomes this
        book's.
        """
        team, need = job.team, job.need
        if held is not None:
            self.held = held  # type: ignore[assignment]
        quota = self.quota(team)
        use = self.use(team)
        if not quota.cohort:
            return over_quota(need, job.gpu_type, quota, use), Usage()
        own = over_quota(need, job.gpu_type, replace(quota, gpus=None, cpus=None, memory=None), use)
        if own:
            return own, Usage()
        borrowed: dict[str, float] = {}
        for resource in BORROWABLE:
            nominal, asked = _get(quota, resource), getattr(need, resource)
            if nominal is None or not asked:
                continue
            used = getattr(use.usage, resource)
            over_after, over_before = max(0.0, used + asked - nominal), max(0.0, used - nominal)
            limit = _get(quota.borrowing_limit, resource)
            if limit is not None and over_after > limit + _EPS:
                return (f"{_needs(resource, asked)}; team quota {_amount(resource, nominal)} + borrowing "
                        f"limit {_amount(resource, limit)}, in use {_amount(resource, used)}"), Usage()
            pool = self.pool(quota.cohort, resource)
            drawn = self.pool_used(quota.cohort, resource) - self._drawn(team, resource) \
                + self._drawn(team, resource, asked)
            if drawn > pool + _EPS:
                if over_after <= _EPS:
                    lent = sum(getattr(self.borrowing(t), resource) for t in self._members[quota.cohort] if t != team)
                    return (f"{_needs(resource, asked)}; team quota {_amount(resource, nominal)}, in use "
                            f"{_amount(resource, used)}, {_amount(resource, lent)} lent to cohort "
                            f"{quota.cohort}"), Usage()
                room = pool - self.pool_used(quota.cohort, resource) \
                    + max(0.0, self._guaranteed(team, resource) - used)
                lends = max(0.0, used + room - nominal)
                return (f"{_needs(resource, asked)}; team quota {_amount(resource, nominal)}, in use "
                        f"{_amount(resource, used)}, cohort {quota.cohort} has {_amount(resource, lends)} "
                        "to lend"), Usage()
            borrowed[resource] = over_after - over_before
        return None, Usage(int(round(borrowed.get("gpus", 0))), borrowed.get("cpus", 0.0),
                           int(round(borrowed.get("memory", 0))))


def ceilings(quotas: Mapping[str, Quota]) -> dict[str, Quota]:
    """Each team's quota raised to the most it could ever hold by borrowing (to refuse jobs that never fit)."""
    book = Book(quotas, {})
    result = {}
    for team, quota in quotas.items():
        if not quota.cohort:
            result[team] = quota
            continue
        raised = {}
        for resource in BORROWABLE:
            nominal = _get(quota, resource)
            if nominal is None:
                continue
            most = nominal - book._lends(team, resource) + book.pool(quota.cohort, resource)
            limit = _get(quota.borrowing_limit, resource)
            if limit is not None:
                most = min(most, nominal + limit)
            raised[resource] = most if resource == "cpus" else int(most)
        result[team] = replace(quota, **raised)
    return result


def dispatched(borrowed: Usage | None, quota: Quota | None) -> dict:
    """The record fields a job gets as it is dispatched: what it borrowed and where; a preemption is over."""
    lent = borrowed is not None and borrowed != Usage() and quota is not None
    return {"borrowed": borrowed if lent else Usage(), "cohort": quota.cohort if lent else "",  # type: ignore[union-attr]
            "preempted": "", "preempted_for": ""}


def reserved_reason(fields: Mapping) -> str:
    """The DEPLOYING reason of a dispatched job, naming what it borrowed (its history keeps it)."""
    if fields["borrowed"] == Usage():
        return "resources reserved; deploying"
    return f"resources reserved ({describe(fields['borrowed'])} borrowed in cohort {fields['cohort']}); deploying"

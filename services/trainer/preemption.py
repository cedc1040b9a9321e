"""Which running jobs to halt so that a waiting one fits: preemption by checkpoint, decided purely.

A waiting job may preempt when it is its quota's owner reclaiming (its team
stays within its own quota, but lent part of it to other teams of its
cohort) or when it has a higher priority than the jobs it would displace.
Candidates, in order (Kueue's): jobs of teams that are borrowing in the
waiting job's cohort first, then lower priority first, newest first; a
candidate from a borrowing team is taken whatever its priority only when
the waiting job reclaims. A job of another member of the cohort that is not
borrowing is never a candidate (what a member holds within its own quota is
guaranteed to it; taking it for priority would only invite it to reclaim). Only running jobs (DEPLOYING or RUNNING) that ran
at least `min_runtime` seconds and were preempted fewer than
`max_preemptions` times qualify. Victims are added until the waiting job
fits beside everything else (its team's quota, its cohort, the backend),
then every victim it can do without is given back, newest-chosen first, so
no more are halted than needed. When even all candidates would not make it
fit, none is halted (halting them would gain nothing).

Jobs already halting are counted as gone: a waiting job that fits once they
are gone waits for them ("being returned by preemption") instead of
preempting more. The dispatcher (services/trainer/preemptor.py) does the
halting through the ordinary halt path, so victims save a checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from trainforge_services.trainer.admission import shortfall, team_use, total
from trainforge_services.trainer.cohorts import Book
from trainforge_services.trainer.resources import BackendSize, Queued, Quota, Usage


@dataclass(frozen=True)
class Running:
    """An ACTIVE job as preemption sees it."""

    job_id: str
    team: str
    need: Usage
    priority: int = 1
    gpu_type: str = ""
    # when it started holding its resources (unix seconds)
    started: float = 0.0
    preemptions: int = 0
    # DEPLOYING or RUNNING: a halt can be asked of it
    haltable: bool = True
    # HALTING or otherwise on its way out: what it holds is as good as free
    leaving: bool = False
    # the waiting job it is being halted for ("" when not preempted)
    preempted_for: str = ""


@dataclass(frozen=True)
class Policy:
    min_runtime: float = 60.0
    max_preemptions: int = 3


@dataclass(frozen=True)
class Decision:
    """Halt `victims` so that `job_id` fits; `reclaim`: its team takes back quota it lent."""

    job_id: str
    team: str
    victims: tuple[Running, ...]
    reclaim: bool

    @property
    def returned(self) -> Usage:
        return total(v.need for v in self.victims)


@dataclass
class Outcome:
    decisions: list[Decision] = field(default_factory=list)
    # waiting job -> what jobs already halting for it will return
    returning: dict[str, Usage] = field(default_factory=dict)


def choose(waiting: Sequence[Queued], running: Sequence[Running], quotas: Mapping[str, Quota],
           capacity: BackendSize, policy: Policy, now: float, *, most: int = 50) -> Outcome:
    """Preemptions for the `waiting` jobs, in their order (at most `most` are considered per call)."""
    staying = [r for r in running if not r.leaving]
    book = Book(quotas, team_use((r.team, r.need, r.gpu_type) for r in staying))
    in_use = total(r.need for r in staying)
    alive = {r.job_id: r for r in staying}
    outcome = Outcome()
    for job in list(waiting)[:most]:
        if _fits(job, book, in_use, capacity):
            returning = [r for r in running if r.leaving and r.preempted_for == job.job_id]
            if returning:
                outcome.returning[job.job_id] = total(r.need for r in returning)
            book.add(job.team, job.need, job.gpu_type)
            in_use = in_use + job.need
            continue
        reclaim = bool(book.quota(job.team).cohort) and book.within_nominal(job.team, job.need)
        candidates = _candidates(job, alive.values(), book, reclaim, policy, now)
        victims = _victims(job, candidates, book, in_use, capacity)
        if not victims:
            continue
        for victim in victims:
            book.remove(victim.team, victim.need, victim.gpu_type)
            in_use = in_use + Usage(-victim.need.gpus, -victim.need.cpus, -victim.need.memory,
                                    -victim.need.learners)
            del alive[victim.job_id]
        book.add(job.team, job.need, job.gpu_type)
        in_use = in_use + job.need
        outcome.decisions.append(Decision(job.job_id, job.team, tuple(victims), reclaim))
    return outcome


def _fits(job: Queued, book: Book, in_use: Usage, capacity: BackendSize) -> bool:
    return book.fit(job)[0] is None and shortfall(job.need, capacity.total, in_use) is None


def _candidates(job: Queued, running: Iterable[Running], book: Book, reclaim: bool, policy: Policy,
                now: float) -> list[Running]:
    cohort = book.quota(job.team).cohort
    found = []
    teams: dict[str, tuple[bool, bool]] = {}  # per team of a running job: (same cohort, borrowing now)
    for r in running:
        if not r.haltable or r.preemptions >= policy.max_preemptions or now - r.started < policy.min_runtime:
            continue
        if (known := teams.get(r.team)) is None:
            same = bool(cohort) and r.team != job.team and book.quota(r.team).cohort == cohort
            known = teams[r.team] = (same, same and book.borrowing(r.team) != Usage())
        same_cohort, borrower = known
        if same_cohort and not borrower:
            continue  # what a cohort member holds within its own quota is never taken by another member
        if r.priority < job.priority or (reclaim and borrower):
            found.append((not borrower, r.priority, -r.started, r.job_id, r))
    return [entry[-1] for entry in sorted(found)]


def _victims(job: Queued, candidates: list[Running], book: Book, in_use: Usage,
             capacity: BackendSize) -> list[Running]:
    """The fewest of `candidates` (taken in order) whose leaving makes `job` fit; [] when none do."""
    trial, use = book.copy(), in_use
    chosen: list[Running] = []
    for victim in candidates:
        trial.remove(victim.team, victim.need, victim.gpu_type)
        use = use + Usage(-victim.need.gpus, -victim.need.cpus, -victim.need.memory, -victim.need.learners)
        chosen.append(victim)
        if _fits(job, trial, use, capacity):
            break
    else:
        return []
    # give back every victim the job can do without, the last chosen first
    for victim in reversed(chosen[:-1]):
        trial.add(victim.team, victim.need, victim.gpu_type)
        back = use + victim.need
        if _fits(job, trial, back, capacity):
            use = back
            chosen.remove(victim)
        else:
            trial.remove(victim.team, victim.need, victim.gpu_type)
    return chosen

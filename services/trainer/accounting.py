"""Per-team usage: what a team's jobs hold now and what they have consumed.

Pure over the records the job store hands out (services/trainer/store_reads.py
`usage_rows`), so the arithmetic is testable without a database. Consumed
GPU- and CPU-seconds are the per-job sums the store adds atomically when a
job leaves the ACTIVE states, plus the running stint of every job still
ACTIVE (now - active_since), so an admin watching a long job sees its
consumption grow rather than jump when it ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from trainforge_services.common import states
from trainforge_services.common.states import JobState
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.resources import BackendSize, Quota, TeamUse, Usage


@dataclass(frozen=True)
class TeamReport:
    team: str
    quota: Quota = Quota()
    held: TeamUse = TeamUse()
    queued_jobs: int = 0
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    # what its active jobs hold on quota borrowed in its cohort
    borrowed: Usage = Usage()

    @property
    def active_jobs(self) -> int:
        return self.held.jobs


@dataclass(frozen=True)
class ClusterView:
    """The backend's capacity as last reported (None: unknown, and why) and what active jobs hold of it."""

    capacity: BackendSize | None
    unknown_reason: str
    held: Usage
    active_jobs: int
    queued_jobs: int


@dataclass
class _Tally:
    held: TeamUse = field(default_factory=TeamUse)
    queued: int = 0
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    borrowed: Usage = field(default_factory=Usage)


def reports(jobs: Iterable[JobRecord], quotas: Mapping[str, Quota], now: float) -> list[TeamReport]:
    """One report per team that has a quota or a job, sorted by team."""
    tallies: dict[str, _Tally] = {team: _Tally() for team in quotas}
    for job in jobs:
        tally = tallies.setdefault(job.team, _Tally())
        tally.gpu_seconds += job.gpu_seconds
        tally.cpu_seconds += job.cpu_seconds
        if job.state == JobState.QUEUED:
            tally.queued += 1
        elif job.state in states.ACTIVE:
            tally.held = tally.held.add(job.holds, job.gpu_type)
            tally.borrowed = tally.borrowed + job.borrowed
            # its minimum since it was reserved, and an elastic job's grant beyond it since the grant
            for since, usage in ((job.active_since, job.resources), (job.grown_since, job.grown)):
                if since is not None:
                    stint = max(0.0, now - since)
                    tally.gpu_seconds += stint * usage.gpus
                    tally.cpu_seconds += stint * usage.cpus
    return [TeamReport(team, quotas.get(team, Quota()), t.held, t.queued, t.gpu_seconds, t.cpu_seconds, t.borrowed)
            for team, t in sorted(tallies.items())]

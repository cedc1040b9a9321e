"""Per-team usage: what a team's jobs hold now and what they have consumed.

Pure over the rows the job store hands out (services/trainer/store.py
`usage_rows`), so the arithmetic is testable without a database. Consumed
GPU- and CPU-seconds are the per-job sums the store adds atomically when a
job leaves the ACTIVE states, plus the running stint of every job still
ACTIVE (now - active_since), so an admin watching a long job sees its
consumption grow rather than jump when it ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from services.common import states
from services.common.states import JobState
from services.trainer.admission import Quota, TeamUse, Usage


@dataclass(frozen=True)
class TeamReport:
    team: str
    quota: Quota = Quota()
    held: TeamUse = TeamUse()
    queued_jobs: int = 0
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0

    @property
    def active_jobs(self) -> int:
        return self.held.jobs


@dataclass
class _Tally:
    held: TeamUse = field(default_factory=TeamUse)
    queued: int = 0
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0


def reports(rows: Iterable[Mapping], quotas: Mapping[str, Quota], now: float) -> list[TeamReport]:
    """One report per team that has a quota or a row, sorted by team."""
    tallies: dict[str, _Tally] = {team: _Tally() for team in quotas}
    for row in rows:
        tally = tallies.setdefault(row["team"], _Tally())
        state = JobState(row["state"])
        resources = row.get("resources") or {}
        tally.gpu_seconds += float(row.get("gpu_seconds") or 0.0)
        tally.cpu_seconds += float(row.get("cpu_seconds") or 0.0)
        if state == JobState.QUEUED:
            tally.queued += 1
        elif state in states.ACTIVE:
            tally.held = tally.held.add(Usage.from_doc(resources), row.get("gpu_type") or "")
            if row.get("active_since") is not None:
                stint = max(0.0, now - float(row["active_since"]))
                tally.gpu_seconds += stint * float(resources.get("gpus", 0))
                tally.cpu_seconds += stint * float(resources.get("cpus", 0.0))
    return [TeamReport(team, quotas.get(team, Quota()), t.held, t.queued, t.gpu_seconds, t.cpu_seconds)
            for team, t in sorted(tallies.items())]

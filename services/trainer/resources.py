"""The Trainer's words for resources: plain, frozen values every layer may use.

What a job needs or holds (`Usage`), what the backend runs at once (`BackendSize`), a team's limits
(`Quota`, with a cohort's `Limits`), what a team holds now (`TeamUse`) and a queued job as admission sees
it (`Queued`). Nothing here reads or writes a store or decides anything: the admission policy (what fits
where, in which order) is services/trainer/admission.py, and how these values are written to MongoDB and
read back is services/trainer/storedocs.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Usage:
    """An amount of every resource admission counts; `learners` is a count of processes."""

    gpus: int = 0
    cpus: float = 0.0
    memory: int = 0
    learners: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.gpus + other.gpus, self.cpus + other.cpus, self.memory + other.memory,
                     self.learners + other.learners)


@dataclass(frozen=True)
class Limits:
    """Per-resource amounts of a cohort's lending or borrowing limit; None is no limit (Kueue's names)."""

    gpus: int | None = None
    cpus: float | None = None
    memory: int | None = None


@dataclass(frozen=True)
class Quota:
    """A team's limits on what its ACTIVE jobs hold at once; None (or a missing type) is no limit.

    A team in a `cohort` may go beyond its gpus/cpus/memory by borrowing what other teams of the
    cohort leave unused (services/trainer/cohorts.py); `jobs` and the per-type limits stay its own.
    """

    gpus: int | None = None
    cpus: float | None = None
    memory: int | None = None
    jobs: int | None = None
    # GPUs of one type ("a100" -> 4); a job asking for a type counts against it and against `gpus`
    gpus_by_type: Mapping[str, int] = field(default_factory=dict)
    cohort: str = ""
    # most of the team's unused nominal quota others may borrow / most it may borrow beyond its own
    lending_limit: Limits = Limits()
    borrowing_limit: Limits = Limits()
    # not a limit admission checks: the team's own egress policy for sandboxed learners (None: the admin's)
    egress: str | None = None


NO_QUOTA = Quota()


@dataclass(frozen=True)
class TeamUse:
    """What one team's ACTIVE jobs hold now."""

    usage: Usage = Usage()
    jobs: int = 0
    gpus_by_type: Mapping[str, int] = field(default_factory=dict)

    def add(self, need: Usage, gpu_type: str = "") -> TeamUse:
        """This use with one more job holding `need`."""
        by_type = dict(self.gpus_by_type)
        if gpu_type and need.gpus:
            by_type[gpu_type] = by_type.get(gpu_type, 0) + need.gpus
        return TeamUse(self.usage + need, self.jobs + 1, by_type)


@dataclass(frozen=True)
class Queued:
    """One QUEUED job as admission sees it."""

    job_id: str
    team: str
    need: Usage
    priority: int = 1
    created_at: float = 0.0
    gpu_type: str = ""
    # requeued after a preemption: first of its priority in its team's queue
    front: bool = False
    # what a pass remembers its answers by: jobs of a kind (team, need, GPU type) fit or wait alike; a
    # string, whose hash Python keeps, made once per job rather than once per job and pass
    kind: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", f"{self.team}\x00{self.need!r}\x00{self.gpu_type}")


@dataclass(frozen=True)
class BackendSize:
    """What the backend runs at once, in total, as the LCM reports it; `total.learners` is its max_learners."""

    total: Usage
    backend: str = ""
    # whether the cluster enforces NetworkPolicies, as the LCM's canary last saw it ("": no canary on this backend)
    network_policy: str = ""

"""Small values the lifecycle hands out."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainforge_services.lcm.backends.base import Handle


@dataclass(frozen=True)
class RunningJob:
    """A job attempt with something still running."""

    job_id: str
    attempt: int
    learners: int
    handles: list[Handle] = field(default_factory=list)

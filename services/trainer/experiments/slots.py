"""How the experiment driver counts a trial's slots of `max_parallel` (services/trainer/experiments/driver.py).

A slot is held by a trial whose learners run or are about to (`SLOT`: pending to running, halting,
restarting); a STORING trial has given its slot up, and a prestarted trial behind its closed gate holds
none until the gate opens. The driver's pass and its hand-over (`ExperimentDriver.hand_over`, in the
transition that freed a slot) both count with these functions, and both only while holding the driver's
one decision lock, so they read the same count and never spend one freed slot twice. Pure: the callers
read the trials' jobs.
"""

from __future__ import annotations

from trainforge_services.common.states import JobState
from trainforge_services.trainer.record import GATE_CLOSED, JobRecord

# a trial job in one of these still needs (or holds) a slot
BUSY = frozenset({JobState.PENDING, JobState.QUEUED, JobState.DEPLOYING, JobState.RUNNING, JobState.STORING,
                  JobState.HALTING, JobState.RESTARTING})
# a trial job in one of these holds one of `max_parallel`'s slots: its learners run or are about to
SLOT = BUSY - {JobState.STORING}
# where a prestarted trial may wait behind its closed gate (a backend that ignores gates shows RUNNING: a slot)
_BEFORE_LEARNERS = frozenset({JobState.PENDING, JobState.QUEUED, JobState.DEPLOYING, JobState.RESTARTING})


def behind_gate(job: JobRecord) -> bool:
    """A prestarted trial whose gate is still closed: it waits (queued, or deployed and prepared) and holds no
    slot of `max_parallel`."""
    return job.gate == GATE_CLOSED and job.state in _BEFORE_LEARNERS


def holds_slot(job: JobRecord) -> bool:
    """A trial whose learners run or are about to: one of `max_parallel`'s slots."""
    return job.state in SLOT and not behind_gate(job)


def free_slots(max_parallel: int, jobs: dict[int, JobRecord]) -> int:
    """How many of `max_parallel`'s slots the trials' jobs (by trial index) leave free; below 0 when more
    trials hold one than the experiment allows (a resume raced a pass, say)."""
    return max_parallel - sum(1 for j in jobs.values() if holds_slot(j))


def held_trials(jobs: dict[int, JobRecord]) -> list[int]:
    """The indexes of the trials waiting behind their closed gates, in trial order: a freed slot goes to the
    first."""
    return sorted(i for i, j in jobs.items() if behind_gate(j))

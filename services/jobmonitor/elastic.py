"""How an elastic job's state follows from its learners' states, kept free of I/O (aggregate.py's rules,
adapted).

An elastic job (manifest `learners: {min, max}`) has slots 0..max-1. A
learner that failed or was lost leaves the group instead of failing the
job: its torchrun peers re-form a smaller group and resume from the
newest checkpoint, and the LCM may start its slot again (a new status
replaces the old one). The job fails only when fewer than `min` learners
remain, or when none of the learners started with the attempt started.
Finished learners decide the end as for any job: COMPLETED once every
learner still in the job completed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.states import (
    LEARNER_DONE,
    LEARNER_EXITED_OK,
    LEARNER_STARTED,
    JobState,
    LearnerState,
)
from trainforge_services.jobmonitor.aggregate import Verdict, failure_reason, halted_verdict, of_attempt


def members(current: Mapping[int, LearnerStatus | None], slots: int, attempt: int,
            last_seen: Mapping[int, LearnerStatus]) -> tuple[dict[int, LearnerStatus], dict[int, str]]:
    """(the learners in the job now by slot, the ones that left it: slot -> why)."""
    docs = {r: d for r, d in current.items() if 0 <= r < slots and d is not None and of_attempt(d, attempt)}
    effective: dict[int, LearnerStatus] = dict(docs)
    left: dict[int, str] = {}
    for rank, status in last_seen.items():
        if rank in docs or not 0 <= rank < slots or not of_attempt(status, attempt):
            continue
        if status.final:
            effective[rank] = status
        else:
            left[rank] = f"learner {rank} lost: its controller stopped renewing its lease"
    for rank, status in list(effective.items()):
        if status.state == LearnerState.LEARNER_FAILED:
            left[rank] = failure_reason(rank, status)
            del effective[rank]
    return effective, left


def world(current: Mapping[int, LearnerStatus | None], slots: int, attempt: int,
          last_seen: Mapping[int, LearnerStatus]) -> tuple[int, int]:
    """(learners running, learners in the job: running or starting) — the current and target world size."""
    effective, _ = members(current, slots, attempt, last_seen)
    running = sum(s.state in LEARNER_STARTED for s in effective.values())
    return running, len(effective)


def aggregate_elastic(current: Mapping[int, LearnerStatus | None], *, slots: int, initial: int, minimum: int,
                      attempt: int, last_seen: Mapping[int, LearnerStatus], waited: float = 0.0,
                      start_timeout: float = math.inf) -> Verdict:
    """The elastic job's state; `initial` slots (0..initial-1) were started with the attempt."""
    effective, left = members(current, slots, attempt, last_seen)
    if left and len(effective) < minimum:
        first = min(left)
        return Verdict(JobState.FAILED, f"{len(effective)} learner(s) left, fewer than the minimum {minimum}: "
                                        f"{left[first]}")
    never = [r for r in range(initial) if r not in effective and r not in left]
    if never and waited >= start_timeout and len(effective) < minimum:
        return Verdict(JobState.FAILED, f"learner {never[0]} never started within {start_timeout:g}s")
    if not effective:
        return Verdict(JobState.DEPLOYING, f"0 of {initial} learners started")
    ranks = sorted(effective)
    states = [effective[r].state for r in ranks]
    note = f" ({len(left)} left the job earlier)" if left else ""
    halted = [r for r in ranks if effective[r].state == LearnerState.LEARNER_HALTED]
    if halted and all(s in (LearnerState.LEARNER_HALTED, LearnerState.LEARNER_COMPLETED) for s in states):
        return halted_verdict(halted, effective, len(ranks))
    if all(s in LEARNER_DONE for s in states):
        return Verdict(JobState.COMPLETED, f"all {len(ranks)} learners completed; outputs stored{note}")
    if all(s in LEARNER_EXITED_OK for s in states):
        storing = sum(s == LearnerState.LEARNER_STORING for s in states)
        return Verdict(JobState.STORING, f"all {len(ranks)} learners exited 0; {storing} storing outputs{note}")
    started = sum(s in LEARNER_STARTED for s in states)
    # one more learner still starting (the job grows) does not take a running job back
    if started >= minimum or started == len(ranks):
        return Verdict(JobState.RUNNING, f"{started} of {len(ranks)} learners running (elastic, "
                                         f"{minimum} to {slots}){note}")
    return Verdict(JobState.DEPLOYING, f"{started} of {len(ranks)} learners started")

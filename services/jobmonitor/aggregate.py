"""How a job's state follows from its learners' states, kept free of I/O.

The job monitor holds the `LearnerStatus` values it has parsed from etcd
and asks `aggregate` what the job's state is; the answer depends only on
the arguments, so every rule of docs/CONTRACTS.md ("Job monitor -> Trainer") is tested without servers.

Two facts are not in the current etcd contents and are passed in: the last
status seen for each rank (a learner whose key vanished after it completed
finished normally; one whose key vanished before that was lost with its
controller) and how long the monitor has waited for learners to appear.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.states import (
    LEARNER_DONE,
    LEARNER_EXITED_OK,
    LEARNER_FINAL,
    LEARNER_STARTED,
    JobState,
    LearnerState,
)

_UNSPECIFIED = LearnerState.LEARNER_STATE_UNSPECIFIED


@dataclass(frozen=True)
class Verdict:
    """The job's state as the learners show it, and a reason a person can act on."""

    state: JobState
    reason: str
    # With HALTED: the step every learner's stored checkpoint reached (None: some stored none).
    checkpoint_step: int | None = None


@dataclass(frozen=True)
class LearnerView:
    """One learner as the monitor reports it: its current status, or the last one seen."""

    rank: int
    state: LearnerState
    exit_code: int | None
    message: str
    present: bool
    isolation: str = ""
    timed_out: bool = False

    @property
    def lost(self) -> bool:
        """Its key vanished before it reached a final state: its controller stopped renewing the lease."""
        return not self.present and self.state != _UNSPECIFIED and self.state not in LEARNER_FINAL


def learner_state(status: LearnerStatus | None) -> LearnerState:
    """The state of a status; UNSPECIFIED when there is none."""
    return status.state if status is not None else _UNSPECIFIED


def of_attempt(status: LearnerStatus | None, attempt: int) -> bool:
    return status is not None and status.attempt == attempt


def learner_views(current: Mapping[int, LearnerStatus | None], last_seen: Mapping[int, LearnerStatus],
                  learners: int, attempt: int) -> list[LearnerView]:
    """Every rank of the attempt, from its current status or else the last one seen (absent: UNSPECIFIED)."""
    views = []
    for rank in range(learners):
        status = current.get(rank)
        present = of_attempt(status, attempt)
        if not present:
            status = last_seen.get(rank) if of_attempt(last_seen.get(rank), attempt) else None
        views.append(LearnerView(
            rank=rank, state=learner_state(status), exit_code=status.exit_code if status else None,
            message=status.message if status else "", present=present,
            isolation=status.isolation if status else "", timed_out=bool(status and status.timed_out),
        ))
    return views


# A preparing summary is a job's reason in listings: long enough for every learner's installer line, no longer.
MAX_PREPARING_CHARS = 300


def preparing_reason(views: list[LearnerView]) -> str:
    """What the learners still preparing say they are doing ("" when none says anything).

    e.g. "preparing: learner 0: installing numpy (12/40); learner 1: restoring the checkpoint"
    """
    parts = [f"learner {v.rank}: {v.message.strip()}" for v in views
             if v.present and v.state == LearnerState.LEARNER_PREPARING and v.message.strip()]
    if not parts:
        return ""
    reason = "preparing: " + "; ".join(parts)
    return reason if len(reason) <= MAX_PREPARING_CHARS else reason[:MAX_PREPARING_CHARS - 1] + "…"


def failure_reason(rank: int, status: LearnerStatus) -> str:
    code = status.exit_code
    reason = f"learner {rank} exited with code {code}" if code is not None else f"learner {rank} failed"
    message = status.message.strip()
    if message:
        reason += f": {message}"
    if status.tail:
        reason += "; last lines:\n" + "\n".join(status.tail)
    return reason


def aggregate(current: Mapping[int, LearnerStatus | None], learners: int, attempt: int,
              last_seen: Mapping[int, LearnerStatus], *, waited: float = 0.0,
              start_timeout: float = math.inf) -> Verdict:
    """The job's state from its learners' statuses.

    current: rank -> the status in etcd now (missing or None: no key, or a
      value that did not parse).
    learners: how many learners the attempt has (ranks 0..learners-1).
    attempt: statuses of any other attempt are ignored, as if absent.
    last_seen: rank -> the last status of this attempt ever seen for it; a
      rank seen before whose key is gone now was lost, unless it had finished.
    waited: seconds since the monitor began waiting; a rank without any status
      after `start_timeout` seconds never started.

    DEPLOYING means "not every learner has started yet": nothing to report.
    """
    docs = {r: d for r, d in current.items() if 0 <= r < learners and of_attempt(d, attempt)}
    seen = {r: d for r, d in last_seen.items() if 0 <= r < learners and of_attempt(d, attempt)}
    # What each rank is now: its status, or for a vanished one its last status if that one had finished.
    effective: dict[int, LearnerStatus] = dict(docs)
    lost: list[int] = []
    for rank, status in seen.items():
        if rank in docs:
            continue
        if status.final:  # its controller wrote its last status and let the key go
            effective[rank] = status
        else:
            lost.append(rank)

    failed = sorted(r for r, d in effective.items() if d.state == LearnerState.LEARNER_FAILED)
    if failed:
        reason = failure_reason(failed[0], effective[failed[0]])
        if len(failed) > 1:
            reason += f"\n(learners {', '.join(map(str, failed[1:]))} failed too)"
        return Verdict(JobState.FAILED, reason)
    if lost:
        return Verdict(JobState.FAILED, f"learner {min(lost)} lost: its controller stopped renewing its lease")
    never = [r for r in range(learners) if r not in effective]
    if never and waited >= start_timeout:
        return Verdict(JobState.FAILED, f"learner {never[0]} never started within {start_timeout:g}s")

    states = [learner_state(effective.get(r)) for r in range(learners)]
    halted = [r for r in range(learners) if states[r] == LearnerState.LEARNER_HALTED]
    if halted and all(s in (LearnerState.LEARNER_HALTED, LearnerState.LEARNER_COMPLETED) for s in states):
        return halted_verdict(halted, effective, learners)
    if all(s in LEARNER_DONE for s in states):
        return Verdict(JobState.COMPLETED, f"all {learners} learners completed; outputs stored")
    if all(s in LEARNER_EXITED_OK for s in states):
        storing = sum(s == LearnerState.LEARNER_STORING for s in states)
        return Verdict(JobState.STORING, f"all {learners} learners exited 0; {storing} storing outputs")
    if all(s in LEARNER_STARTED for s in states):
        return Verdict(JobState.RUNNING, f"all {learners} learners started")
    started = sum(s in LEARNER_STARTED for s in states)
    return Verdict(JobState.DEPLOYING, f"{started} of {learners} learners started")


def halted_verdict(halted: list[int], statuses: Mapping[int, LearnerStatus], learners: int) -> Verdict:
    """Every learner checkpointed and exited (one that had already completed counts as done)."""
    steps = [statuses[r].step for r in halted]
    known = [s for s in steps if s is not None]
    step = min(known) if len(known) == len(steps) else None
    where = f"at step {step}" if step is not None else "without a checkpoint of every learner; resume starts over"
    done = f" ({learners - len(halted)} had completed)" if len(halted) < learners else ""
    return Verdict(JobState.HALTED, f"all {learners} learners halted {where}{done}", step)

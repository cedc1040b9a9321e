"""How a job's state follows from its learners' states, kept free of I/O.

The job monitor holds what it has seen in etcd and asks `aggregate` what the
job's state is; the answer depends only on the arguments, so every rule of
docs/CONTRACTS.md ("Job monitor -> Trainer") is tested without servers.

Two facts are not in the current etcd contents and are passed in: the last
status seen for each rank (a learner whose key vanished after it completed
finished normally; one whose key vanished before that was lost with its
controller) and how long the monitor has waited for learners to appear.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from services.common.states import LEARNER_EXITED_OK, LEARNER_FINAL, LEARNER_STARTED, JobState, LearnerState

# A learner whose key vanished after reaching a final state did not get lost:
# its controller finished and let its lease go.
_FINISHED = LEARNER_FINAL
_EXITED_OK = LEARNER_EXITED_OK


@dataclass(frozen=True)
class Verdict:
    """The job's state as the learners show it, and a reason a person can act on."""

    state: JobState
    reason: str
    # With HALTED: the step every learner's stored checkpoint reached (None: some stored none).
    checkpoint_step: int | None = None


@dataclass(frozen=True)
class LearnerView:
    """One learner as the monitor reports it: its current doc, or the last one seen."""

    rank: int
    state: LearnerState
    exit_code: int | None
    message: str
    present: bool


def learner_state(doc: Mapping | None) -> LearnerState:
    """The `state` of a status doc; UNSPECIFIED when absent or not a learner state."""
    if not doc:
        return LearnerState.LEARNER_STATE_UNSPECIFIED
    try:
        return LearnerState(int(doc.get("state", 0)))
    except (TypeError, ValueError):
        return LearnerState.LEARNER_STATE_UNSPECIFIED


def of_attempt(doc: Mapping | None, attempt: int) -> bool:
    return bool(doc) and doc.get("attempt") == attempt


def learner_views(current: Mapping[int, Mapping | None], last_seen: Mapping[int, Mapping],
                  learners: int, attempt: int) -> list[LearnerView]:
    """Every rank of the attempt, from its current doc or else the last one seen (absent: UNSPECIFIED)."""
    views = []
    for rank in range(learners):
        doc = current.get(rank)
        present = of_attempt(doc, attempt)
        if not present:
            doc = last_seen.get(rank) if of_attempt(last_seen.get(rank), attempt) else None
        code = doc.get("exit_code") if doc else None
        views.append(LearnerView(
            rank=rank, state=learner_state(doc),
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            message=str(doc.get("message") or "") if doc else "", present=present,
        ))
    return views


def _failure_reason(rank: int, doc: Mapping) -> str:
    code = doc.get("exit_code")
    reason = f"learner {rank} exited with code {code}" if isinstance(code, int) else f"learner {rank} failed"
    message = str(doc.get("message") or "").strip()
    if message:
        reason += f": {message}"
    tail = [str(line) for line in (doc.get("tail") or []) if line is not None]
    if tail:
        reason += "; last lines:\n" + "\n".join(tail)
    return reason


def aggregate(current: Mapping[int, Mapping | None], learners: int, attempt: int,
              last_seen: Mapping[int, Mapping], *, waited: float = 0.0,
              start_timeout: float = math.inf) -> Verdict:
    """The job's state from its learners' status docs.

    current: rank -> the status doc in etcd now (missing or None: no key).
    learners: how many learners the attempt has (ranks 0..learners-1).
    attempt: docs of any other attempt are ignored, as if absent.
    last_seen: rank -> the last doc of this attempt ever seen for it; a rank
      seen before whose key is gone now was lost, unless it had finished.
    waited: seconds since the monitor began waiting; a rank without any doc
      after `start_timeout` seconds never started.

    DEPLOYING means "not every learner has started yet": nothing to report.
    """
    docs = {r: d for r, d in current.items() if 0 <= r < learners and of_attempt(d, attempt)}
    seen = {r: d for r, d in last_seen.items() if 0 <= r < learners and of_attempt(d, attempt)}
    # What each rank is now: its doc, or for a vanished one its last doc if that one had finished.
    effective: dict[int, Mapping] = dict(docs)
    lost: list[int] = []
    for rank, doc in seen.items():
        if rank in docs:
            continue
        if learner_state(doc) in _FINISHED:
            effective[rank] = doc
        else:
            lost.append(rank)

    failed = sorted(r for r, d in effective.items() if learner_state(d) == LearnerState.LEARNER_FAILED)
    if failed:
        reason = _failure_reason(failed[0], effective[failed[0]])
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
        return _halted(halted, effective, learners)
    if all(s == LearnerState.LEARNER_COMPLETED for s in states):
        return Verdict(JobState.COMPLETED, f"all {learners} learners completed; outputs stored")
    if all(s in _EXITED_OK for s in states):
        storing = sum(s == LearnerState.LEARNER_STORING for s in states)
        return Verdict(JobState.STORING, f"all {learners} learners exited 0; {storing} storing outputs")
    if all(s in LEARNER_STARTED for s in states):
        return Verdict(JobState.RUNNING, f"all {learners} learners started")
    started = sum(s in LEARNER_STARTED for s in states)
    return Verdict(JobState.DEPLOYING, f"{started} of {learners} learners started")


def _halted(halted: list[int], docs: Mapping[int, Mapping], learners: int) -> Verdict:
    """Every learner checkpointed and exited (one that had already completed counts as done)."""
    steps = [docs[r].get("step") for r in halted]
    known = [s for s in steps if isinstance(s, int) and not isinstance(s, bool)]
    step = min(known) if len(known) == len(steps) else None
    where = f"at step {step}" if step is not None else "without a checkpoint of every learner; resume starts over"
    done = f" ({learners - len(halted)} had completed)" if len(halted) < learners else ""
    return Verdict(JobState.HALTED, f"all {learners} learners halted {where}{done}", step)

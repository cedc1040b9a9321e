"""The job and learner lifecycles: one definition, from the proto.

`JobState` and `LearnerState` are the generated proto enums re-exported as
Python IntEnums, so code compares members, never strings. The table of legal
job transitions lives here and nowhere else; the Trainer's store turns
`allowed_from(to)` into the filter of an atomic find-one-and-update.
"""

from __future__ import annotations

import enum

from trainforge_protos import common_pb2

JobState = enum.IntEnum("JobState", {n: v for n, v in common_pb2.JobState.items()})
LearnerState = enum.IntEnum("LearnerState", {n: v for n, v in common_pb2.LearnerState.items()})

TERMINAL: frozenset[JobState] = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})

# Holding resources: these count against quota and capacity.
ACTIVE: frozenset[JobState] = frozenset(
    {JobState.DEPLOYING, JobState.RUNNING, JobState.STORING, JobState.HALTING, JobState.RESTARTING}
)

# to-state -> the states it may be entered from.
_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.PENDING, JobState.HALTED, JobState.RESTARTING}),
    JobState.DEPLOYING: frozenset({JobState.QUEUED}),
    JobState.RUNNING: frozenset({JobState.DEPLOYING}),
    # from HALTING too: the learners finished (exit 0) before the halt reached them, so the job completes
    JobState.STORING: frozenset({JobState.RUNNING, JobState.HALTING}),
    JobState.COMPLETED: frozenset({JobState.STORING}),
    JobState.HALTING: frozenset({JobState.DEPLOYING, JobState.RUNNING}),
    JobState.HALTED: frozenset({JobState.HALTING}),
    JobState.RESTARTING: frozenset({JobState.DEPLOYING, JobState.RUNNING}),
    JobState.FAILED: frozenset(
        {JobState.PENDING, JobState.QUEUED, JobState.DEPLOYING, JobState.RUNNING, JobState.STORING,
         JobState.HALTING, JobState.RESTARTING}
    ),
    JobState.CANCELLED: frozenset(
        {JobState.PENDING, JobState.QUEUED, JobState.DEPLOYING, JobState.RUNNING, JobState.STORING,
         JobState.HALTING, JobState.HALTED, JobState.RESTARTING}
    ),
}

# The main line a job walks while it succeeds; the monitor reports every
# step it skipped over so each transition stays legal and recorded.
MAIN_LINE: tuple[JobState, ...] = (
    JobState.DEPLOYING, JobState.RUNNING, JobState.STORING, JobState.COMPLETED,
)


def is_terminal(state: JobState) -> bool:
    return state in TERMINAL


def allowed_from(to: JobState) -> frozenset[JobState]:
    """States from which `to` may be entered (empty: never)."""
    return _TRANSITIONS.get(to, frozenset())


def can_transition(frm: JobState, to: JobState) -> bool:
    return frm in allowed_from(to)


def path_along_main_line(frm: JobState, to: JobState) -> list[JobState]:
    """The states to report to get from `frm` to `to` along the main line.

    [] when `to` is not ahead of `frm` on it; e.g. DEPLOYING -> COMPLETED gives
    [RUNNING, STORING, COMPLETED].
    """
    if frm not in MAIN_LINE or to not in MAIN_LINE:
        return [to] if can_transition(frm, to) else []
    i, j = MAIN_LINE.index(frm), MAIN_LINE.index(to)
    return list(MAIN_LINE[i + 1 : j + 1])


def job_state(name_or_value: str | int) -> JobState:
    """Parse a state from user input ("running", "RUNNING" or 4)."""
    if isinstance(name_or_value, int):
        return JobState(name_or_value)
    try:
        return JobState[name_or_value.strip().upper()]
    except KeyError:
        valid = ", ".join(s.name.lower() for s in JobState if s.value)
        raise ValueError(f"unknown job state {name_or_value!r}; valid: {valid}") from None


# The learner's lifecycle, as its controller walks it; the sets below are the only place they are grouped.
# A final state is the last one a controller writes (without a lease, so it outlives the controller).
LEARNER_FINAL: frozenset[LearnerState] = frozenset(
    {LearnerState.LEARNER_COMPLETED, LearnerState.LEARNER_FAILED, LearnerState.LEARNER_HALTED})
# The learner process has exited (it may still be storing outputs).
LEARNER_EXITED: frozenset[LearnerState] = LEARNER_FINAL | {LearnerState.LEARNER_STORING}
# The learner process exited 0.
LEARNER_EXITED_OK: frozenset[LearnerState] = frozenset({LearnerState.LEARNER_STORING, LearnerState.LEARNER_COMPLETED})
LEARNER_DONE: frozenset[LearnerState] = frozenset({LearnerState.LEARNER_COMPLETED})
LEARNER_STARTED: frozenset[LearnerState] = frozenset(
    {LearnerState.LEARNER_RUNNING, LearnerState.LEARNER_STORING, LearnerState.LEARNER_COMPLETED,
     LearnerState.LEARNER_HALTING, LearnerState.LEARNER_HALTED}
)

"""The lifecycle tables: one definition, consistent with the proto."""

import pytest

from trainforge_protos import common_pb2
from trainforge_services.common import states
from trainforge_services.common.states import JobState, LearnerState


def test_enums_mirror_the_proto_with_unspecified_zero():
    assert {s.name: s.value for s in JobState} == dict(common_pb2.JobState.items())
    assert {s.name: s.value for s in LearnerState} == dict(common_pb2.LearnerState.items())
    assert JobState(0).name == "JOB_STATE_UNSPECIFIED"
    assert LearnerState(0).name == "LEARNER_STATE_UNSPECIFIED"


def test_terminal_states_have_no_way_out():
    for terminal in states.TERMINAL:
        assert states.is_terminal(terminal)
        for to in JobState:
            assert not states.can_transition(terminal, to), f"{terminal.name} -> {to.name}"


def test_every_non_terminal_state_can_be_cancelled():
    for s in JobState:
        if s.value and not states.is_terminal(s):
            assert states.can_transition(s, JobState.CANCELLED), s.name


def test_unspecified_is_never_entered_or_left():
    for s in JobState:
        assert not states.can_transition(JobState.JOB_STATE_UNSPECIFIED, s)
        assert not states.can_transition(s, JobState.JOB_STATE_UNSPECIFIED)


@pytest.mark.parametrize(("frm", "to", "path"), [
    (JobState.DEPLOYING, JobState.COMPLETED, [JobState.RUNNING, JobState.STORING, JobState.COMPLETED]),
    (JobState.RUNNING, JobState.STORING, [JobState.STORING]),
    (JobState.STORING, JobState.RUNNING, []),
    (JobState.RUNNING, JobState.FAILED, [JobState.FAILED]),
    (JobState.COMPLETED, JobState.FAILED, []),
])
def test_path_along_main_line(frm, to, path):
    assert states.path_along_main_line(frm, to) == path
    prev = frm
    for step in path:
        assert states.can_transition(prev, step)
        prev = step


def test_parse_user_state():
    assert states.job_state("running") is JobState.RUNNING
    assert states.job_state(6) is JobState.COMPLETED
    with pytest.raises(ValueError, match="unknown job state 'runing'"):
        states.job_state("runing")


def test_a_halting_job_can_still_complete_but_only_through_storing():
    assert states.can_transition(JobState.HALTING, JobState.STORING)
    assert not states.can_transition(JobState.HALTING, JobState.COMPLETED)
    assert states.path_along_main_line(JobState.HALTING, JobState.STORING) == [JobState.STORING]

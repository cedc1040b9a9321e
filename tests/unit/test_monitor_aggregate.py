"""The job monitor's aggregation rules, exhaustively: a pure function of what etcd showed."""

from __future__ import annotations

import itertools

import pytest

from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.states import JobState, LearnerState
from trainforge_services.jobmonitor.aggregate import aggregate, learner_state, learner_views

L = LearnerState
ATTEMPT = 2


def doc(state: LearnerState, attempt: int = ATTEMPT, **extra) -> LearnerStatus:
    # Through the wire format, as the monitor reads it from etcd.
    value = {"state": int(state), "attempt": attempt, "exit_code": None, "ts": 1.0, "message": "", "tail": [],
             "outputs_uri": "", **extra}
    return LearnerStatus.parse(value)


def agg(current: dict, learners: int = 2, last_seen: dict | None = None, **kw):
    seen = dict(current if last_seen is None else last_seen)
    return aggregate(current, learners, ATTEMPT, seen, **kw)


def test_nothing_written_yet_is_still_deploying():
    v = agg({})
    assert v.state == JobState.DEPLOYING
    assert v.reason == "0 of 2 learners started"


def test_preparing_is_not_started():
    v = agg({0: doc(L.LEARNER_RUNNING), 1: doc(L.LEARNER_PREPARING)})
    assert v.state == JobState.DEPLOYING
    assert v.reason == "1 of 2 learners started"


def test_every_learner_started_is_running():
    assert agg({0: doc(L.LEARNER_RUNNING), 1: doc(L.LEARNER_RUNNING)}).state == JobState.RUNNING


def test_running_with_some_already_storing_or_completed_is_running():
    assert agg({0: doc(L.LEARNER_RUNNING), 1: doc(L.LEARNER_STORING)}).state == JobState.RUNNING
    assert agg({0: doc(L.LEARNER_COMPLETED), 1: doc(L.LEARNER_RUNNING)}).state == JobState.RUNNING


def test_all_exited_zero_and_one_storing_is_storing():
    v = agg({0: doc(L.LEARNER_COMPLETED, exit_code=0), 1: doc(L.LEARNER_STORING, exit_code=0)})
    assert v.state == JobState.STORING
    assert "exited 0" in v.reason


def test_all_completed_is_completed():
    v = agg({0: doc(L.LEARNER_COMPLETED), 1: doc(L.LEARNER_COMPLETED)})
    assert v == v.__class__(JobState.COMPLETED, "all 2 learners completed; outputs stored")


def test_failed_names_rank_exit_code_and_tail():
    v = agg({0: doc(L.LEARNER_RUNNING),
             1: doc(L.LEARNER_FAILED, exit_code=3, tail=["epoch 1", "Traceback", "ValueError: boom"])})
    assert v.state == JobState.FAILED
    assert v.reason == "learner 1 exited with code 3; last lines:\nepoch 1\nTraceback\nValueError: boom"


def test_failed_without_exit_code_uses_message():
    v = agg({0: doc(L.LEARNER_FAILED, message="could not download store://datasets/x")}, learners=1)
    assert v.reason == "learner 0 failed: could not download store://datasets/x"


def test_failed_with_message_and_no_tail():
    v = agg({0: doc(L.LEARNER_FAILED, exit_code=-9, message="killed by signal 9")}, learners=1)
    assert v.reason == "learner 0 exited with code -9: killed by signal 9"


def test_several_failed_names_the_lowest_rank_and_the_others():
    v = agg({0: doc(L.LEARNER_RUNNING), 1: doc(L.LEARNER_FAILED, exit_code=1),
             2: doc(L.LEARNER_FAILED, exit_code=2)}, learners=3)
    assert v.reason.startswith("learner 1 exited with code 1")
    assert v.reason.endswith("(learners 2 failed too)")


def test_failure_wins_over_a_loss_and_everything_else():
    current = {0: doc(L.LEARNER_FAILED, exit_code=1), 2: doc(L.LEARNER_COMPLETED)}
    seen = {**current, 1: doc(L.LEARNER_RUNNING)}
    assert agg(current, learners=3, last_seen=seen).state == JobState.FAILED
    assert agg(current, learners=3, last_seen=seen).reason.startswith("learner 0 exited with code 1")


@pytest.mark.parametrize("last", [L.LEARNER_PREPARING, L.LEARNER_RUNNING, L.LEARNER_STORING, L.LEARNER_HALTING])
def test_a_vanished_unfinished_learner_is_lost(last):
    v = agg({0: doc(L.LEARNER_RUNNING)}, last_seen={0: doc(L.LEARNER_RUNNING), 1: doc(last)})
    assert v.state == JobState.FAILED
    assert v.reason == "learner 1 lost: its controller stopped renewing its lease"


def test_a_vanished_completed_learner_is_not_lost():
    current = {1: doc(L.LEARNER_COMPLETED)}
    seen = {0: doc(L.LEARNER_COMPLETED), 1: doc(L.LEARNER_COMPLETED)}
    assert agg(current, last_seen=seen).state == JobState.COMPLETED
    assert agg({}, last_seen=seen).state == JobState.COMPLETED
    assert agg({1: doc(L.LEARNER_RUNNING)}, last_seen={**seen, 1: doc(L.LEARNER_RUNNING)}).state == JobState.RUNNING


def test_a_vanished_failed_learner_still_fails_the_job():
    failed = doc(L.LEARNER_FAILED, exit_code=2, tail=["x"])
    v = agg({0: doc(L.LEARNER_RUNNING)}, last_seen={0: doc(L.LEARNER_RUNNING), 1: failed})
    assert v.reason == "learner 1 exited with code 2; last lines:\nx"


def test_a_learner_never_seen_is_not_lost_but_times_out():
    current = {0: doc(L.LEARNER_RUNNING)}
    assert agg(current, waited=299, start_timeout=300).state == JobState.DEPLOYING
    v = agg(current, waited=300, start_timeout=300)
    assert v == v.__class__(JobState.FAILED, "learner 1 never started within 300s")
    assert agg({}, waited=2.5, start_timeout=2.5).reason == "learner 0 never started within 2.5s"


def test_a_slow_but_present_learner_does_not_time_out():
    current = {0: doc(L.LEARNER_RUNNING), 1: doc(L.LEARNER_PREPARING)}
    assert agg(current, waited=1000, start_timeout=1).state == JobState.DEPLOYING


def test_docs_of_other_attempts_are_ignored():
    current = {0: doc(L.LEARNER_RUNNING), 1: doc(L.LEARNER_FAILED, attempt=ATTEMPT - 1, exit_code=1)}
    assert agg(current).state == JobState.DEPLOYING
    current[1] = doc(L.LEARNER_COMPLETED, attempt=ATTEMPT + 1)
    assert agg(current).state == JobState.DEPLOYING
    # an old attempt's doc vanishing is not a loss of this attempt's learner
    assert agg({0: doc(L.LEARNER_RUNNING)}, last_seen={1: doc(L.LEARNER_RUNNING, attempt=1)}).state \
        == JobState.DEPLOYING
    # a doc without an attempt belongs to none: it does not parse, and the monitor skips it
    assert LearnerStatus.parse_or_none({"state": int(L.LEARNER_FAILED)}) is None
    assert agg({0: None}, learners=1).state == JobState.DEPLOYING


def test_this_attempts_learner_replaced_by_another_attempts_doc_is_lost():
    current = {0: doc(L.LEARNER_RUNNING), 1: doc(L.LEARNER_PREPARING, attempt=ATTEMPT + 1)}
    seen = {0: doc(L.LEARNER_RUNNING), 1: doc(L.LEARNER_RUNNING)}
    assert agg(current, last_seen=seen).reason == "learner 1 lost: its controller stopped renewing its lease"


def test_ranks_outside_the_attempt_are_ignored():
    current = {0: doc(L.LEARNER_COMPLETED), 1: doc(L.LEARNER_FAILED, exit_code=1), -1: doc(L.LEARNER_FAILED)}
    assert agg(current, learners=1).state == JobState.COMPLETED


def test_unknown_or_malformed_states_count_as_not_started():
    for bad in ({"state": 99, "attempt": ATTEMPT}, {"state": "running", "attempt": ATTEMPT}, {"attempt": ATTEMPT}):
        assert LearnerStatus.parse_or_none(bad) is None, bad
    assert learner_state(None) == L.LEARNER_STATE_UNSPECIFIED
    parsed = LearnerStatus.parse_or_none({"state": 99, "attempt": ATTEMPT})
    assert agg({0: parsed}, learners=1).state == JobState.DEPLOYING


def test_halting_learners_keep_the_job_running_until_every_one_halted():
    assert agg({0: doc(L.LEARNER_HALTING), 1: doc(L.LEARNER_HALTED)}).state == JobState.RUNNING
    assert agg({}, last_seen={0: doc(L.LEARNER_HALTED), 1: doc(L.LEARNER_HALTED)}).state == JobState.HALTED


_PRESENT = [L.LEARNER_STATE_UNSPECIFIED, L.LEARNER_PREPARING, L.LEARNER_RUNNING, L.LEARNER_STORING,
            L.LEARNER_COMPLETED, L.LEARNER_FAILED, L.LEARNER_HALTING, L.LEARNER_HALTED, None]


def test_every_combination_of_three_learners_follows_the_rules():
    """None: never written. Checked against the rules stated independently of the implementation."""
    for combo in itertools.product(_PRESENT, repeat=3):
        current = {r: doc(s) for r, s in enumerate(combo) if s is not None}
        v = aggregate(current, 3, ATTEMPT, current, waited=0, start_timeout=10)
        present = [s for s in combo if s is not None]
        if L.LEARNER_FAILED in present:
            expected = JobState.FAILED
        elif (len(present) == 3 and L.LEARNER_HALTED in present
              and all(s in (L.LEARNER_HALTED, L.LEARNER_COMPLETED) for s in present)):
            expected = JobState.HALTED
        elif len(present) == 3 and all(s == L.LEARNER_COMPLETED for s in present):
            expected = JobState.COMPLETED
        elif len(present) == 3 and all(s in (L.LEARNER_STORING, L.LEARNER_COMPLETED) for s in present):
            expected = JobState.STORING
        elif len(present) == 3 and all(s in (L.LEARNER_RUNNING, L.LEARNER_STORING, L.LEARNER_COMPLETED,
                                             L.LEARNER_HALTING, L.LEARNER_HALTED) for s in present):
            expected = JobState.RUNNING
        else:
            expected = JobState.DEPLOYING
        assert v.state == expected, (combo, v)
        assert isinstance(v.state, JobState)
        assert v.reason


def test_every_learner_that_vanishes_unfinished_is_lost():
    for combo in itertools.product(_PRESENT[1:-1], repeat=2):
        seen = {r: doc(s) for r, s in enumerate(combo)}
        v = aggregate({}, 2, ATTEMPT, seen)
        unfinished = [r for r, s in enumerate(combo)
                      if s not in (L.LEARNER_COMPLETED, L.LEARNER_FAILED, L.LEARNER_HALTED)]
        if L.LEARNER_FAILED in combo:
            assert v.reason.startswith(f"learner {combo.index(L.LEARNER_FAILED)} failed"), combo
        elif unfinished:
            assert v.reason == f"learner {unfinished[0]} lost: its controller stopped renewing its lease", combo
        elif L.LEARNER_HALTED in combo:
            assert v.state == JobState.HALTED, combo
        else:
            assert v.state == JobState.COMPLETED, combo


def test_learner_views_fall_back_to_the_last_doc_seen():
    current = {0: doc(L.LEARNER_RUNNING, message="step 10"), 1: doc(L.LEARNER_FAILED, attempt=1)}
    seen = {0: current[0], 1: doc(L.LEARNER_COMPLETED, exit_code=0)}
    views = learner_views(current, seen, 3, ATTEMPT)
    assert [(v.rank, v.state, v.exit_code, v.message, v.present) for v in views] == [
        (0, L.LEARNER_RUNNING, None, "step 10", True),
        (1, L.LEARNER_COMPLETED, 0, "", False),
        (2, L.LEARNER_STATE_UNSPECIFIED, None, "", False),
    ]


def test_every_learner_halted_is_halted_at_the_smallest_step():
    H = LearnerState.LEARNER_HALTED
    v = agg({0: doc(H, step=120), 1: doc(H, step=119)})
    assert (v.state, v.checkpoint_step) == (JobState.HALTED, 119)
    assert v.reason == "all 2 learners halted at step 119"


def test_halted_while_others_still_checkpoint_is_not_yet_halted():
    v = agg({0: doc(LearnerState.LEARNER_HALTED, step=5), 1: doc(LearnerState.LEARNER_HALTING)})
    assert v.state == JobState.RUNNING


def test_a_learner_without_a_checkpoint_makes_the_halt_start_over():
    v = agg({0: doc(LearnerState.LEARNER_HALTED, step=5), 1: doc(LearnerState.LEARNER_HALTED, step=None)})
    assert (v.state, v.checkpoint_step) == (JobState.HALTED, None)
    assert "resume starts over" in v.reason


def test_a_learner_that_completed_before_the_halt_counts_as_done():
    v = agg({0: doc(LearnerState.LEARNER_COMPLETED), 1: doc(LearnerState.LEARNER_HALTED, step=7)})
    assert (v.state, v.checkpoint_step) == (JobState.HALTED, 7)
    assert "(1 had completed)" in v.reason


def test_a_halted_learner_whose_key_vanished_is_still_halted():
    halted = doc(LearnerState.LEARNER_HALTED, step=3)
    v = agg({0: halted}, learners=2, last_seen={0: halted, 1: halted})
    assert v.state == JobState.HALTED

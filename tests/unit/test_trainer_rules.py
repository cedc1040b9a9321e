"""The transition rules without a database: which rule governs which transition, and what each one does.

A recording stand-in for the dispatcher's `Actions` and a small in-memory
store with the job store's transition signature, so each rule is checked on
its own; the same rules against MongoDB are in
tests/integration/test_trainer_halt_restart.py.
"""

from __future__ import annotations

import pytest

from trainforge_services.common import states
from trainforge_services.common.states import JobState
from trainforge_services.trainer import rules
from trainforge_services.trainer.record import JobRecord, StatusEvent
from trainforge_services.trainer.rules import Lifecycle, Proposal
from trainforge_services.trainer.store import Transition


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def wake(self) -> None:
        self.calls.append(("wake", ""))

    def deploy(self, job: JobRecord) -> None:
        self.calls.append(("deploy", job.id))

    def halt(self, job: JobRecord) -> None:
        self.calls.append(("halt", job.id))

    def clean_up(self, job_id: str) -> None:
        self.calls.append(("clean_up", job_id))


class MemoryStore:
    """Just enough of JobStore: a compare-and-set on one record, and the cleanup flag."""

    def __init__(self, job: JobRecord):
        self.job = job
        self.cleaned: list[tuple[str, int]] = []

    def apply_transition(self, job_id, to, reason, actor, *, attempt=None, set_fields=None,  # noqa: ANN001
                         only_from=None) -> Transition:
        job = self.job
        if job.state == to:
            return Transition(job, False)
        allowed = states.allowed_from(to) & frozenset(only_from or rules.ALL)
        if job.state not in allowed or (attempt is not None and attempt != job.attempt):
            return Transition(None, False)
        event = StatusEvent(from_state=job.state, to_state=to, reason=reason, actor=actor)
        pending = job.state in states.ACTIVE and job.state != JobState.RESTARTING and \
            (to not in states.ACTIVE or to == JobState.RESTARTING)
        changes = {"cleanup_pending": True} if pending else {}
        self.job = job.model_copy(update={**changes, **(set_fields or {}), "state": to, "reason": reason,
                                          "history": (*job.history, event)})
        return Transition(self.job, True)

    def cleanup_done(self, job_id: str, attempt: int) -> None:
        self.cleaned.append((job_id, attempt))
        self.job = self.job.model_copy(update={"cleanup_pending": False})


def job(state: JobState, *, max_restarts: int = 0, backoff: str = "10s", restarts: int = 0) -> JobRecord:
    manifest = {"name": "j", "command": "x", "restart": {"max_restarts": max_restarts, "backoff": backoff}}
    return JobRecord(id="j", team="t", state=state, manifest=manifest, restarts=restarts)


def lifecycle(record: JobRecord, now: float = 1000.0) -> tuple[Lifecycle, MemoryStore, Recorder]:
    store, actions = MemoryStore(record), Recorder()
    return Lifecycle(store, actions, clock=lambda: now), store, actions  # type: ignore[arg-type]


def failed(reason: str = "learner 0 lost") -> Proposal:
    return Proposal(JobState.FAILED, reason, attempt_failed=True)


def test_a_failed_attempt_restarts_with_doubling_backoff_capped():
    life, _, _ = lifecycle(job(JobState.RUNNING))
    delays = []
    for k in range(3):
        p = life.propose(job(JobState.RUNNING, max_restarts=3, backoff="2s", restarts=k), failed())
        assert p.to == JobState.RESTARTING and p.fields["restarts"] == k + 1
        delays.append(p.fields["restart_delay"])
    assert delays == [2.0, 4.0, 8.0]
    assert p.reason == "restart 3 of 3 in 8s after: learner 0 lost"
    assert rules.restart_delay(100.0, 5) == rules.MAX_BACKOFF


def test_no_restarts_left_fails_and_says_so():
    life, _, _ = lifecycle(job(JobState.RUNNING))
    p = life.propose(job(JobState.DEPLOYING, max_restarts=2, restarts=2), failed())
    assert (p.to, p.reason) == (JobState.FAILED, "learner 0 lost\n(no restarts left: 2 of 2 used)")
    assert life.propose(job(JobState.RUNNING), failed()) == failed()  # no policy: the failure as reported
    storing = life.propose(job(JobState.STORING, max_restarts=1), failed("upload failed"))
    assert (storing.to, storing.reason) == (JobState.FAILED, "upload failed\n(no restarts left: 0 of 1 used)")


def test_a_failure_while_halting_is_halted_and_a_deploy_failure_never_restarts():
    life, _, _ = lifecycle(job(JobState.HALTING))
    p = life.propose(job(JobState.HALTING, max_restarts=3), failed())
    assert p.to == JobState.HALTED and "last stored checkpoint" in p.reason
    plain = Proposal(JobState.FAILED, "deploy failed: backend exploded")
    assert life.propose(job(JobState.DEPLOYING, max_restarts=3), plain) == plain


def test_a_halting_job_whose_learners_finished_completes_and_is_no_longer_preempted():
    life, _, _ = lifecycle(job(JobState.HALTING))
    halting = job(JobState.HALTING).model_copy(update={"preempted": "halted for j2", "preempted_for": "j2"})
    p = life.propose(halting, Proposal(JobState.STORING, "all 2 learners exited 0"))
    assert p.to == JobState.STORING and "finished before the halt reached them" in p.reason
    assert (p.fields["preempted"], p.fields["preempted_for"]) == ("", "")


@pytest.mark.parametrize(("frm", "to", "expected"), [
    (JobState.QUEUED, JobState.DEPLOYING, [("deploy", "j")]),
    (JobState.RUNNING, JobState.HALTING, [("halt", "j")]),
    (JobState.RUNNING, JobState.CANCELLED, [("clean_up", "j"), ("wake", "")]),
    (JobState.HALTING, JobState.HALTED, [("clean_up", "j"), ("wake", "")]),
    (JobState.HALTING, JobState.STORING, []),
    (JobState.RUNNING, JobState.RESTARTING, [("clean_up", "j")]),
    (JobState.PENDING, JobState.QUEUED, [("wake", "")]),
    (JobState.QUEUED, JobState.CANCELLED, [("wake", "")]),
    (JobState.DEPLOYING, JobState.RUNNING, []),
])
def test_each_transition_runs_its_rules_once(frm, to, expected):
    life, store, actions = lifecycle(job(frm))
    done = life.move("j", to, "test", "someone")
    assert done.changed and store.job.state == to
    assert actions.calls == expected
    assert not life.move("j", to, "again", "someone").changed
    assert actions.calls == expected  # a repeated transition runs nothing


def test_a_refused_transition_runs_no_rule():
    life, _, actions = lifecycle(job(JobState.QUEUED))
    assert not life.move("j", JobState.COMPLETED, "too soon", "monitor").changed
    assert actions.calls == []


def test_a_cleaned_up_restart_is_requeued_as_its_next_attempt_after_its_backoff():
    record = job(JobState.RESTARTING, restarts=1).model_copy(update={"restart_delay": 4.0, "cleanup_pending": True})
    life, store, actions = lifecycle(record, now=1000.0)
    life.cleaned_up(record)
    queued = store.job
    assert (queued.state, queued.attempt, queued.not_before, queued.cleanup_pending) == \
        (JobState.QUEUED, 2, 1004.0, False)
    assert queued.checkpoint_uri == "store://jobs/j/checkpoints/"
    assert queued.reason == "restart 1: queued as attempt 2, from the last checkpoint"
    assert actions.calls == [("wake", "")]


def test_a_cleaned_up_job_that_is_not_restarting_is_only_marked_clean():
    record = job(JobState.CANCELLED).model_copy(update={"cleanup_pending": True})
    life, store, actions = lifecycle(record)
    life.cleaned_up(record)
    assert store.cleaned == [("j", 1)] and store.job.state == JobState.CANCELLED
    assert actions.calls == []


def test_a_cleaned_up_preempted_job_is_requeued_first_from_its_checkpoint():
    why = "preempted: halted to return 2 GPUs to team vision"
    record = job(JobState.HALTED).model_copy(update={"cleanup_pending": True, "preempted": why,
                                                     "checkpoint_step": 40})
    life, store, actions = lifecycle(record)
    life.cleaned_up(record)
    queued = store.job
    assert (queued.state, queued.attempt, queued.cleanup_pending, queued.preempted) == (JobState.QUEUED, 2, False, why)
    assert queued.queued().front and queued.checkpoint_uri == "store://jobs/j/checkpoints/"
    assert queued.reason == (f"{why}; requeued first in team t's queue as attempt 2, continues from its checkpoint "
                             "at step 40")
    assert actions.calls == [("wake", "")]


def test_a_job_halted_by_its_user_stays_halted():
    record = job(JobState.HALTED).model_copy(update={"cleanup_pending": True})
    life, store, _ = lifecycle(record)
    life.cleaned_up(record)
    assert store.job.state == JobState.HALTED and store.cleaned == [("j", 1)]


def test_a_failing_effect_never_undoes_the_transition(caplog):
    class Broken(rules.Rule):
        TO = frozenset({JobState.CANCELLED})

        def after(self, frm, job, actions):  # noqa: ANN001
            raise RuntimeError("boom")

    store, actions = MemoryStore(job(JobState.QUEUED)), Recorder()
    life = Lifecycle(store, actions, rules=(Broken(), rules.LeftQueue()))  # type: ignore[arg-type]
    assert life.move("j", JobState.CANCELLED, "stop", "user").changed
    assert actions.calls == [("wake", "")] and "rule Broken" in caplog.text

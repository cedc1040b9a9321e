"""The Announce rule: terminal and HALTED states (and nothing else) are enqueued once per committed transition."""

from __future__ import annotations

from tests.unit.test_trainer_rules import MemoryStore, Recorder, job
from trainforge_services.common.states import JobState
from trainforge_services.trainer import rules
from trainforge_services.trainer.rules import Announce, Lifecycle


def test_terminal_and_halted_states_are_announced_once_others_never():
    announced = []
    for frm, to, expected in [(JobState.STORING, JobState.COMPLETED, True), (JobState.RUNNING, JobState.FAILED, True),
                              (JobState.QUEUED, JobState.CANCELLED, True), (JobState.HALTING, JobState.HALTED, True),
                              (JobState.DEPLOYING, JobState.RUNNING, False), (JobState.RUNNING, JobState.HALTING, False)]:
        announced.clear()
        store = MemoryStore(job(frm))
        life = Lifecycle(store, Recorder(), (*rules.DEFAULT_RULES, Announce(announced.append)))  # type: ignore[arg-type]
        life.move("j", to, "why", "test")
        life.move("j", to, "again", "test")  # no second transition, no second announcement
        assert [j.state for j in announced] == ([to] if expected else []), (frm, to)

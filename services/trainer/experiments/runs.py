"""The use cases every run of many jobs shares: a new run's checks, listing, and moving its state.

A run (an experiment, a workflow) is stored by run_store.py and acted on by
the driver's passes, so a use case only checks, stores and wakes the driver:
a new run needs a team and an id that stays a job id once its jobs add their
suffixes; a state change is a compare-and-set from the states it may leave
(already there: as it is; elsewhere: Conflict, saying why). service.py
(experiments) and workflows.py (workflows) add what each kind does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar, Generic

from trainforge_services.common.contracts.experiments import ExperimentState
from trainforge_services.common.contracts.ids import check_job_id
from trainforge_services.common.errors import Conflict, InvalidArgument
from trainforge_services.trainer.experiments.run_store import R, RunStore

MAX_LIST = 1000


def state_name(state: ExperimentState) -> str:
    """running, completed, failed, cancelled, halted."""
    return state.name.removeprefix("EXPERIMENT_").lower()


class RunService(Generic[R]):
    """A kind's use cases over its store; `wake` wakes the driver that acts on what they store."""

    KIND: ClassVar[str] = "run"
    MAX_ID: ClassVar[int]  # the longest id: the run's jobs' ids add their own suffixes and must stay job ids

    def __init__(self, store: RunStore[R], wake: Callable[[], object]):
        self._store = store
        self._wake = wake

    @staticmethod
    def require_team(team: str) -> None:
        if not team:
            raise InvalidArgument("team is required", details=[{"field": "team", "message": "required"}])

    def check_id(self, run_id: str) -> str:
        """`run_id` when it is a job id of at most `MAX_ID` characters; InvalidArgument naming the field else."""
        field = f"{self.KIND}_id"
        check_job_id(run_id, field)
        if len(run_id) > self.MAX_ID:
            raise InvalidArgument(f"{field}: at most {self.MAX_ID} characters",
                                  details=[{"field": field, "message": f"at most {self.MAX_ID} characters"}])
        return run_id

    def list(self, team: str, limit: int = 0) -> list[R]:
        """The team's runs, newest first: `limit` of them (0: 100, at most `MAX_LIST`)."""
        if limit < 0:
            raise InvalidArgument("limit must not be negative", details=[{"field": "limit", "message": "must be >= 0"}])
        return self._store.list(team, min(limit or 100, MAX_LIST))

    def _move(self, team: str, run_id: str, to: ExperimentState, reason: str, only_from: Iterable[ExperimentState],
              refused: Callable[[R], str]) -> R:
        """The run moved to `to` (already there: as it is), the driver woken to act on its jobs; Conflict with
        `refused(run)` from any other state."""
        run = self._store.get(team, run_id)
        if run.state == to:
            return run
        moved = self._store.move(run.id, to, reason, only_from=only_from)
        if moved is None:
            raise Conflict(f"{self.KIND} {run_id!r} {refused(run)}")
        self._wake()
        return moved

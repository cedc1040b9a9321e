"""The experiment use cases behind the Trainer's experiment RPCs: submit, get, list, cancel, halt, resume.

Submit validates the recipe (services/common/contracts/experiments.py),
plans every trial from the seed (services/common/contracts/sampling.py),
refuses a trial that could never fit (the job service's own check, on the
first trial), and stores the experiment RUNNING; the driver submits the
trials. Cancel, halt and resume only move the experiment's state (a
compare-and-set) and wake the driver, which does it to the trials, so a
Trainer that dies right after still does it when it comes back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from trainforge_services.common.contracts.experiments import EXPERIMENT_ENDED, ExperimentSpec, ExperimentState
from trainforge_services.common.contracts.ids import new_experiment_id
from trainforge_services.common.contracts.recipes import experiment_from_recipe
from trainforge_services.common.contracts.sampling import trial_manifest
from trainforge_services.trainer.experiments.driver import ExperimentDriver
from trainforge_services.trainer.experiments.runs import RunService, state_name
from trainforge_services.trainer.experiments.store import ExperimentRecord, ExperimentStore, best_trial
from trainforge_services.trainer.job_service import JobService
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.store import JobStore

log = logging.getLogger(__name__)
_RUNNING, _HALTED = ExperimentState.EXPERIMENT_RUNNING, ExperimentState.EXPERIMENT_HALTED


@dataclass(frozen=True)
class ExperimentView:
    """An experiment with its current trial jobs and its best trial."""

    experiment: ExperimentRecord
    jobs: dict[int, JobRecord]
    best: int | None


class ExperimentService(RunService[ExperimentRecord]):
    KIND = "experiment"
    MAX_ID = 28  # a trial's job id adds "-<index>-<gen>" and must stay a job id

    def __init__(self, experiments: ExperimentStore, jobs: JobStore, job_service: JobService,
                 driver: ExperimentDriver):
        super().__init__(experiments, driver.wake)
        self._experiments = experiments
        self._jobs = jobs
        self._job_service = job_service
        self.refs = job_service.refs

    def submit(self, team: str, recipe: str, *, code_uri: str = "", submitted_by: str = "",
               experiment_id: str = "", workflow_id: str = "") -> ExperimentView:
        self.require_team(team)
        planned = experiment_from_recipe(recipe)
        return self.create(team, planned.spec, planned.trials, code_uri=code_uri, submitted_by=submitted_by,
                           experiment_id=experiment_id or new_experiment_id(), workflow_id=workflow_id,
                           notes=planned.notes)

    def create(self, team: str, spec: ExperimentSpec, plan: list[dict], *, code_uri: str, submitted_by: str,
               experiment_id: str, workflow_id: str = "", notes: list[str] | tuple[str, ...] = ()) -> ExperimentView:
        """Store a validated, planned experiment (RUNNING) and wake the driver; Conflict when the id is taken."""
        self.check_id(experiment_id)
        first = trial_manifest(spec, 0, plan[0], experiment_id)
        # each trial is checked again at its submit, its code archive included (its experiment exists by then)
        self._job_service.refs.reads(team, first, field="template.")
        self._job_service.refuse_if_never_fits(team, first)
        exp = self._experiments.insert(experiment_id, team, spec, plan, code_uri=code_uri,
                                       submitted_by=submitted_by, workflow_id=workflow_id,
                                       reason=f"{len(plan)} trials planned; at most {spec.max_parallel} at once"
                                       + "".join(f"; translated {n}" for n in notes))
        log.info("experiment %s (%s): %d trials planned", exp.id, exp.name, len(plan))
        self._wake()
        return self.view(exp)

    def find_view(self, experiment_id: str) -> ExperimentView | None:
        """Any team's experiment with its trials (for the platform itself: the workflow runner)."""
        exp = self._store.find(experiment_id)
        return None if exp is None else self.view(exp)

    def view(self, exp: ExperimentRecord) -> ExperimentView:
        jobs = {j.trial: j for j in self._jobs.of_experiment(exp.id) if j.id == exp.trial_job_id(j.trial)}
        return ExperimentView(exp, jobs, best_trial(exp, exp.parsed(), jobs))

    def get(self, team: str, experiment_id: str) -> ExperimentView:
        return self.view(self._store.get(team, experiment_id))

    def cancel(self, team: str, experiment_id: str, actor: str) -> ExperimentView:
        return self.view(self._move(
            team, experiment_id, ExperimentState.EXPERIMENT_CANCELLED, f"cancelled by {actor or 'user'}",
            [_RUNNING, _HALTED],
            lambda exp: f"already {state_name(exp.state)}; only a running or halted experiment can be cancelled"))

    def halt(self, team: str, experiment_id: str, actor: str) -> ExperimentView:
        return self.view(self._move(
            team, experiment_id, _HALTED, f"halted by {actor or 'user'}; running trials checkpoint and stop",
            [_RUNNING], lambda exp: f"is {state_name(exp.state)}; only a running experiment can be halted"))

    def resume(self, team: str, experiment_id: str, actor: str) -> ExperimentView:
        return self.view(self._move(
            team, experiment_id, _RUNNING, f"resumed by {actor or 'user'}; continues where it stopped", [_HALTED],
            lambda exp: ("has ended" if exp.state in EXPERIMENT_ENDED else f"is {state_name(exp.state)}")
            + "; only a halted experiment can be resumed"))

"""A team's experiments over HTTP: parameter sweeps whose trials are ordinary jobs.

Scoped like jobs: every route takes the caller's team (TenantDep), and
another team's experiment is a 404 exactly like a missing one. The trials
are jobs: their logs, metrics and outputs are read through /v1/jobs/{trial}.
The routes are a run's (routes/runs.py); an experiment adds halt and resume.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trainforge_services.api.routes.runs import RunRoutes, run_model


class Trial(BaseModel):
    index: int
    job_id: str | None = Field(description="the trial's job (logs, metrics, outputs: /v1/jobs/{job_id}); null "
                                           "until it is submitted")
    state: str = Field(description="the job's state, or not_submitted")
    params: dict[str, Any] = Field(description="the trial's parameter values")
    objective: float | None = Field(description="the last objective value the trial reported")
    stopped_at_rung: int | None = Field(description="ASHA stopped (halted) the trial at this rung")
    rungs: dict[str, float] = Field(description="ASHA: the objective at each rung the trial reached")
    reason: str
    best: bool = Field(description="the experiment's best trial")


Experiment = run_model(
    "Experiment", states="running, completed, failed, cancelled, halted",
    objective=(dict[str, Any] | None, Field(description="{metric, goal}")), trial_count=int, best_trial=int | None,
    trials=(list[Trial], Field(description="sorted by the objective, best first; empty in a listing")),
    spec=(dict[str, Any], Field(description="the validated experiment")))

routes = RunRoutes("experiment", "experiments", model=Experiment, example="x-1a2b3c4d5e6f")
router = routes.router
routes.submit(summary="Submit an experiment (a parameter sweep)",
              recipe="the experiment recipe, YAML or JSON: `kind: experiment`, or Hyper's `experiments:` shape with "
                     "one experiment",
              doc="""Validate the recipe (each problem names its field), store the code once for every trial, and hand the
experiment to the Trainer, which submits its trials as jobs, at most `max_parallel` at once.""")
routes.listing(summary="The team's experiments, newest first")
routes.one(summary="One experiment with its trials, best first")
_CONFLICT = "the experiment's state does not allow it"
routes.action("halt", summary="Halt an experiment: its running trials checkpoint and stop, no new trial starts",
              conflict=_CONFLICT)
routes.action("resume", summary="Resume a halted experiment where it stopped", conflict=_CONFLICT)
routes.action("cancel", summary="Cancel an experiment and every trial it still runs", conflict=_CONFLICT)

"""The experiment driver: a Trainer thread that moves every open experiment on, from the store alone.

Each pass reads an experiment and its trial jobs and does what is due: records each trial's objective and ASHA rung
results, halts a trial ASHA stops, resumes one ASHA promotes, submits the next planned trials up to `max_parallel`,
and settles the experiment once no trial is left to run. `max_parallel` bounds the trials whose learners run or are
about to (`SLOT`: pending to running, halting, restarting; the count is in services/trainer/experiments/slots.py); a
trial that is STORING (every learner exited, its outputs uploading) gives its slot to the next trial at once, so
besides `max_parallel` trials with learners up to `max_parallel` more may still be storing (each still holds its
resources in the team's quota until it ends).

Prestarted trials (`prestart`, docs/EXPERIMENTS.md): besides the trials holding slots, up to `prestart` of the next
trials are submitted *gated*: they go through the queue and deploy like any job (so each holds its resources in the
team's quota and the backend's capacity), their controllers prepare everything and hold the learner back until the
job's gate opens. They hold no slot while held. When a slot frees, the first held trial's gate is opened before any
new trial is submitted (after the experiment's own resumes and ASHA's promotions), so the next learner starts
without waiting for an admission and a deploy; the next held trial is then submitted. Where nothing comes before it,
the gate is opened in the transition that freed the slot (`hand_over`, called by the `TrialChanged` rule), not in
the pass that transition wakes. Opening is a compare-and-set on the job (`gate` "closed" -> "open") written before
the LCM is told, so a restart repeats the act, not the decision. A halt of the experiment cancels held trials (they
have no learner to checkpoint) like queued ones; a cancel cancels them with the rest. Nothing lives in the driver's
memory: a Trainer killed at any point starts again from what MongoDB holds. Trial job ids are deterministic
(`<experiment>-<index>[-<gen>]`), so a submit repeated after a crash finds the job it made (Conflict on the id)
instead of starting a second one, and every decision is written before it is acted on (the stopped rung before the
halt, the promotion before the resume), so a repeated pass repeats the act, which is idempotent, never the decision.

A halted experiment halts its running trials and cancels its queued ones (bumping their generation, so resume
submits them again); a cancelled one cancels every trial. The pass is woken when a trial's job changes to a state
the driver acts on (`TrialChanged`, a rule: not the PENDING, QUEUED and DEPLOYING that follow its own submits) and
otherwise every `interval` seconds (a `common/loop.Loop`, which also runs it at start).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import ClassVar

from trainforge_services.common import states
from trainforge_services.common.contracts.experiments import ExperimentSpec, ExperimentState
from trainforge_services.common.contracts.sampling import trial_manifest
from trainforge_services.common.errors import Conflict, InvalidArgument, TrainforgeError
from trainforge_services.common.loop import Loop
from trainforge_services.common.states import JobState
from trainforge_services.trainer.experiments import asha
from trainforge_services.trainer.experiments.metrics import MetricsReader, last_value, points
from trainforge_services.trainer.experiments.slots import BUSY, SLOT, behind_gate, free_slots, held_trials
from trainforge_services.trainer.experiments.store import ExperimentRecord, ExperimentStore, best_trial
from trainforge_services.trainer.job_service import JobService
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.rules import Rule
from trainforge_services.trainer.store import JobStore

log = logging.getLogger(__name__)
ACTOR = "experiment-driver"
_WAITING = frozenset({JobState.PENDING, JobState.QUEUED})
_HALTABLE = frozenset({JobState.DEPLOYING, JobState.RUNNING})
# whose metrics may still change what the driver knows
_REPORTING = frozenset({JobState.RUNNING, JobState.STORING, JobState.COMPLETED, JobState.HALTING,
                        JobState.HALTED})
# How long a hand-over waits for a pass over an experiment to end before it leaves the decision to the pass
HAND_OVER_WAIT = 0.5
OPEN = (ExperimentState.EXPERIMENT_RUNNING, ExperimentState.EXPERIMENT_HALTED, ExperimentState.EXPERIMENT_CANCELLED)


class TrialChanged(Rule):
    """A trial's job entering a state the driver acts on wakes it (the wiring adds it with the driver's wake).

    PENDING, QUEUED and DEPLOYING follow the driver's own submits (or a resume) and free nothing; a pass
    on each would only re-read the experiment. The driver's interval pass still runs whatever happens.
    """

    # a trial entering one of these may let the driver act (a slot freed, a trial ended, halted or running)
    TO: ClassVar[frozenset[JobState]] = frozenset(JobState) - {JobState.PENDING, JobState.QUEUED, JobState.DEPLOYING}

    def __init__(self, wake: threading.Event):
        self._wake = wake
        # the driver's hand-over (ExperimentDriver.hand_over), set by the wiring once the driver exists
        self.hand_over: Callable[[JobRecord], object] | None = None

    def after(self, frm: JobState, job: JobRecord, actions: object) -> None:
        if not job.experiment_id:
            return
        if self.hand_over is not None and frm in SLOT and job.state not in SLOT:
            self.hand_over(job)  # its slot goes to the next held trial now, in the transition that freed it
        self._wake.set()  # and the pass does the rest (the next prestart, the objective, settling)


class ExperimentDriver:
    def __init__(self, experiments: ExperimentStore, jobs: JobStore, service: JobService,
                 metrics: MetricsReader | None, *, interval: float = 2.0, wake: threading.Event | None = None):
        self._experiments = experiments
        self._jobs = jobs
        self._service = service
        self._metrics = metrics
        # the rule's `wake` event (TrialChanged) wakes the loop; so does `wake()`
        self._loop = Loop("experiment-driver", self.tick, interval=interval, when=lambda: self.active(),
                          wake_on=wake)
        # one decider at a time over the trials' slots: a pass over an experiment, or a hand-over
        self._deciding = threading.Lock()
        self._decider: int | None = None  # the thread holding it (a hand-over its own acts cause is left to it)
        # the workflow runner (services/trainer/experiments/workflows.py), set by the wiring
        self.workflows: object | None = None
        # among Trainer replicas only the elected one drives experiments (services/trainer/replicas.py)
        self.active: Callable[[], bool] = lambda: True

    # -- the loop ---------------------------------------------------------------

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(timeout=30)

    def wake(self) -> None:
        self._loop.wake()

    def tick(self) -> None:
        """One pass over every experiment that is not settled."""
        started, cpu = time.perf_counter(), time.thread_time()
        unsettled = self._experiments.unsettled(OPEN)
        for experiment in unsettled:
            try:
                self.advance(experiment)
            except TrainforgeError as e:
                log.warning("experiment %s: pass stopped: %s", experiment.id, e.message)
        if unsettled:  # the timing line bench/chain_trace.py reads (a pass's wall time and this thread's CPU)
            log.info("experiment pass: %d experiment(s) in %.1f ms, cpu %.1f ms", len(unsettled),
                     (time.perf_counter() - started) * 1000, (time.thread_time() - cpu) * 1000)
        if self.workflows is not None:
            try:
                self.workflows.tick()  # type: ignore[attr-defined]
            except TrainforgeError as e:
                log.warning("workflow pass stopped: %s", e.message)

    # -- one experiment -----------------------------------------------------------

    def _trial_jobs(self, exp: ExperimentRecord, states: frozenset[JobState] | None = None,
                    ) -> tuple[dict[int, JobRecord], list[JobRecord]]:
        """The current generation's job per trial, and the jobs of earlier generations (only those in `states`)."""
        current, stray = {}, []
        found = self._jobs.of_experiment(exp.id) if states is None else self._jobs.of_experiment(exp.id, states)
        for job in found:
            if job.id == exp.trial_job_id(job.trial):
                current[job.trial] = job
            else:
                stray.append(job)
        return current, stray

    def advance(self, exp: ExperimentRecord) -> None:
        with self._deciding:
            self._decider = threading.get_ident()
            try:
                self._advance(exp)
            finally:
                self._decider = None

    def hand_over(self, job: JobRecord, *, wait: float = HAND_OVER_WAIT) -> JobRecord | None:
        """A trial just left its slot (STORING, ended, halted): open the first held trial's gate now, in the
        transition that freed the slot, instead of in the pass that transition wakes. The opened job, or None
        when nothing was opened (no held trial, no free slot, or the decision is the pass's).

        Only that one decision: the same count of slots as the pass's, under the same lock (so a pass and a
        hand-over never spend one freed slot twice), and only where the pass would open that gate first:
        an experiment that is running, with no trial waiting to be resumed with it and no early stopping
        (whose promotions come first, after the pass has read the trials' metrics). The gate's
        compare-and-set is written before the LCM is told, as in the pass; what a crash leaves, the next
        pass finds. A hand-over caused by the driver's own act (a cancel) or that finds a pass running for
        longer than `wait` seconds is left to the pass, which the transition wakes anyway."""
        if not self.active() or self._decider == threading.get_ident():
            return None
        if not self._deciding.acquire(timeout=wait):
            return None
        try:
            exp = self._experiments.find(job.experiment_id)
            if exp is None or exp.state != ExperimentState.EXPERIMENT_RUNNING:
                return None
            spec = exp.parsed()
            if spec.prestart == 0 or spec.early_stopping is not None:
                return None
            if any(t.held for t in exp.trials.values()):
                return None  # resumes with the experiment come first: the pass's
            # only the trials that can hold a slot or wait at a gate: not the experiment's ended ones
            jobs, _ = self._trial_jobs(exp, BUSY)
            free = free_slots(spec.max_parallel, jobs)
            waiting = held_trials(jobs)
            if free <= 0 or not waiting:
                return None
            return self._service.open_gate(jobs[waiting[0]].id, ACTOR)
        finally:
            self._deciding.release()

    def _advance(self, exp: ExperimentRecord) -> None:
        jobs, stray = self._trial_jobs(exp)
        for job in stray:  # a halt bumped the generation and died before cancelling the old job
            if not states.is_terminal(job.state):
                self._service.cancel(exp.team, job.id, ACTOR)
        if exp.state == ExperimentState.EXPERIMENT_CANCELLED:
            self._cancel_all(exp, jobs)
        elif exp.state == ExperimentState.EXPERIMENT_HALTED:
            self._halt_all(exp, jobs)
        else:
            self._run_experiment(exp, exp.parsed(), jobs)

    def _cancel_all(self, exp: ExperimentRecord, jobs: dict[int, JobRecord]) -> None:
        pending = [j for j in jobs.values() if not states.is_terminal(j.state)]
        for job in pending:
            self._service.cancel(exp.team, job.id, ACTOR)
        if not pending:  # settled once a pass finds nothing left to do
            self._experiments.settle(exp.id, ExperimentState.EXPERIMENT_CANCELLED)

    def _halt_all(self, exp: ExperimentRecord, jobs: dict[int, JobRecord]) -> None:
        acted = False
        for index, job in jobs.items():
            if job.state in _WAITING or behind_gate(job):
                # nothing to checkpoint (a prestarted trial's learner never started): the trial goes back to
                # "not submitted" under a new generation
                self._experiments.set_trial(exp.id, index, gen=exp.progress(index).gen + 1)
                self._service.cancel(exp.team, job.id, ACTOR)
                acted = True
            elif job.state in _HALTABLE:
                # noted first, so resume knows which halted trials the experiment's halt stopped
                self._experiments.set_trial(exp.id, index, held=True)
                self._service.halt(exp.team, job.id, ACTOR)
                acted = True
            elif job.state in (JobState.RESTARTING, JobState.HALTING):
                acted = True  # look again once it settles
        if not acted:
            self._experiments.settle(exp.id, ExperimentState.EXPERIMENT_HALTED)

    def _run_experiment(self, exp: ExperimentRecord, spec: ExperimentSpec, jobs: dict[int, JobRecord]) -> None:
        observed = self._observe(exp, spec, jobs)
        if observed is not None:
            exp = observed
            jobs, _ = self._trial_jobs(exp)
        free = free_slots(spec.max_parallel, jobs)
        for index, job in sorted(jobs.items()):
            if not exp.progress(index).held:
                continue
            if job.state != JobState.HALTED:
                self._experiments.set_trial(exp.id, index, held=False)  # resumed by an earlier pass
            elif free > 0:
                self._service.resume(exp.team, job.id, ACTOR)  # halted with the experiment: resumed with it
                free -= 1
        ladder = self._ladder(exp)
        if free > 0 and spec.early_stopping is not None and spec.objective is not None:
            for index, _rung in asha.promotable(ladder, spec.objective, spec.early_stopping.asha):
                job = jobs.get(index)
                if free <= 0 or job is None or job.state != JobState.HALTED:
                    continue
                self._experiments.set_trial(exp.id, index, stopped_at=None)
                self._service.resume(exp.team, job.id, ACTOR)
                free -= 1
        # a freed slot goes to the first held trial: prepared, its learner starts as soon as the LCM says so
        waiting = held_trials(jobs)
        opened = 0
        for index in waiting:
            if free <= 0:
                break
            # None: a concurrent pass opened it first; either way it holds a slot now
            self._service.open_gate(jobs[index].id, ACTOR)
            free -= 1
            opened += 1
        held_now = len(waiting) - opened
        unsubmitted = (index for index in range(len(exp.plan)) if index not in jobs)
        for index in unsubmitted:
            if free > 0:
                self._submit(exp, spec, index)
                free -= 1
            elif held_now < spec.prestart:
                self._submit(exp, spec, index, gated=True)
                held_now += 1
            else:
                break
        if free >= 0 and self._finished(exp, spec, jobs):
            self._settle(exp, spec)

    def _submit(self, exp: ExperimentRecord, spec: ExperimentSpec, index: int, *, gated: bool = False) -> None:
        manifest = trial_manifest(spec, index, exp.plan[index], exp.id)
        try:
            self._service.submit(exp.team, manifest.model_dump_json(), code_uri=exp.code_uri,
                                 submitted_by=exp.submitted_by, job_id=exp.trial_job_id(index),
                                 experiment_id=exp.id, trial=index, gated=gated)
        except Conflict as e:
            if "already taken" not in e.message:
                raise
            # made by a pass that died before it could see it: the job exists once, as it should
        except InvalidArgument as e:
            # the trial can never run (the team's quota shrank below it, say): the experiment fails, saying why
            reason = f"trial {index} cannot be submitted: {e.message}"
            if self._experiments.move(exp.id, ExperimentState.EXPERIMENT_FAILED, reason,
                                      only_from=[ExperimentState.EXPERIMENT_RUNNING]) is not None:
                self._experiments.settle(exp.id, ExperimentState.EXPERIMENT_FAILED)
            raise

    def _observe(self, exp: ExperimentRecord, spec: ExperimentSpec,
                 jobs: dict[int, JobRecord]) -> ExperimentRecord | None:
        """Record objectives and rung results; halt the trials ASHA stops. The experiment re-read, if it changed."""
        objective = spec.objective
        if objective is None or self._metrics is None:
            return None
        changed = False
        for index, job in sorted(jobs.items()):
            progress = exp.progress(index)
            if job.state not in _REPORTING:
                continue
            mark = f"{int(job.state)}:{job.attempt}"
            if job.state in (JobState.COMPLETED, JobState.HALTED) and progress.read == mark:
                continue  # a settled trial's metrics were read once it settled; they do not change
            records = self._metrics.records(job.id, exp.team, settled=job.state in (JobState.COMPLETED, JobState.HALTED))
            value = last_value(records, objective.metric)
            if value is not None and value != progress.objective:
                self._experiments.set_trial(exp.id, index, objective=value)
                changed = True
            if spec.early_stopping is not None and progress.stopped_at is None:
                changed = self._climb(exp, spec, index, job, records) or changed
            if job.state in (JobState.COMPLETED, JobState.HALTED):
                self._experiments.set_trial(exp.id, index, read=mark)
                changed = True
        return self._experiments.find(exp.id) if changed else None

    def _climb(self, exp: ExperimentRecord, spec: ExperimentSpec, index: int, job: JobRecord,
               records: list[dict]) -> bool:
        """Record the rungs the trial reached since the last pass; stop (halt) it where ASHA says so."""
        ladder_spec, objective = spec.early_stopping.asha, spec.objective  # type: ignore[union-attr]
        progress = exp.progress(index)
        seen = asha.reached(points(records, ladder_spec.resource, objective.metric), ladder_spec.rungs())  # type: ignore[union-attr]
        new = sorted(k for k in seen if k not in progress.rungs)
        for rung in new:
            self._experiments.set_trial(exp.id, index, rungs={rung: seen[rung]})
            if job.state != JobState.RUNNING:
                continue  # finished or halting: counted at the rung, nothing to decide
            fresh = self._experiments.find(exp.id) or exp
            if not asha.continues(self._ladder(fresh), index, rung, objective, ladder_spec):  # type: ignore[arg-type]
                self._experiments.set_trial(exp.id, index, stopped_at=rung)
                log.info("experiment %s: trial %d stopped at rung %d (%s=%g)", exp.id, index, rung,
                         objective.metric, seen[rung])  # type: ignore[union-attr]
                try:
                    self._service.halt(exp.team, job.id, ACTOR)
                except Conflict:
                    # it finished (or failed) since this pass read it: nothing is left to stop
                    self._experiments.set_trial(exp.id, index, stopped_at=None)
                break
        return bool(new)

    def _ladder(self, exp: ExperimentRecord) -> dict[int, asha.TrialRungs]:
        return {i: asha.TrialRungs(values=t.rungs, stopped_at=t.stopped_at) for i, t in exp.trials.items()}

    def _finished(self, exp: ExperimentRecord, spec: ExperimentSpec, jobs: dict[int, JobRecord]) -> bool:
        if len(jobs) < len(exp.plan):
            return False
        # a trial halted by the scheduler (preempted) comes back on its own: it is not done
        if any(j.state in BUSY or (j.state == JobState.HALTED and (exp.progress(i).held or j.preempted))
               for i, j in jobs.items()):
            return False
        fresh = self._experiments.find(exp.id) or exp
        if spec.objective is not None and self._metrics is not None and any(
                fresh.progress(i).read != f"{int(j.state)}:{j.attempt}" for i, j in jobs.items()
                if j.state in (JobState.COMPLETED, JobState.HALTED)):
            return False  # a trial ended after this pass read its metrics: the next pass reads its last values
        if spec.early_stopping is not None and spec.objective is not None:
            waiting = [i for i, _ in asha.promotable(self._ladder(fresh), spec.objective, spec.early_stopping.asha)
                       if jobs[i].state == JobState.HALTED]
            if waiting:
                return False
        return True

    def _settle(self, exp: ExperimentRecord, spec: ExperimentSpec) -> None:
        exp = self._experiments.find(exp.id) or exp
        jobs, _ = self._trial_jobs(exp)
        done = [i for i, j in jobs.items() if j.state == JobState.COMPLETED]
        failed = [i for i, j in jobs.items() if j.state == JobState.FAILED]
        stopped = [i for i in jobs if exp.progress(i).stopped_at is not None]
        parts = [f"{len(done)} of {len(exp.plan)} trials completed"]
        if stopped:
            parts.append(f"{len(stopped)} stopped early")
        if failed:
            parts.append(f"{len(failed)} failed (trial {failed[0]}: {jobs[failed[0]].reason})")
        best = best_trial(exp, spec, jobs)
        if best is not None and spec.objective is not None:
            parts.append(f"best trial {best} ({spec.objective.metric}={exp.progress(best).objective:g})")
        to = ExperimentState.EXPERIMENT_COMPLETED if done else ExperimentState.EXPERIMENT_FAILED
        self._experiments.set_best(exp.id, best)
        moved = self._experiments.move(exp.id, to, "; ".join(parts), only_from=[ExperimentState.EXPERIMENT_RUNNING])
        if moved is not None:
            self._experiments.settle(exp.id, to)
            log.info("experiment %s: %s: %s", exp.id, to.name, moved.reason)


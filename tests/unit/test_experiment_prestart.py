"""The experiment driver's decisions about prestarted trials, on in-memory stand-ins of its stores and service.

A pass is run on a given picture of the trials' jobs; the test reads what
the driver asked of the job service (submit, gated or not; open a gate;
cancel; halt) and what it wrote to the experiment's record.
"""

from __future__ import annotations

import threading

import pytest

from trainforge_services.common.contracts.experiments import ExperimentState, parse_experiment
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.states import JobState
from trainforge_services.trainer.experiments.driver import ExperimentDriver, TrialChanged
from trainforge_services.trainer.experiments.slots import behind_gate, holds_slot
from trainforge_services.trainer.experiments.store import ExperimentRecord, TrialProgress
from trainforge_services.trainer.record import GATE_CLOSED, GATE_OPEN, JobRecord

EXP = "x-0123456789ab"


class Jobs:
    """The JobStore's `of_experiment`, and the JobService calls the driver makes, recorded in order."""

    def __init__(self, jobs: list[JobRecord]):
        self.jobs = {j.id: j for j in jobs}
        self.calls: list[tuple] = []

    def of_experiment(self, experiment_id: str, states: frozenset[JobState] | None = None) -> list[JobRecord]:
        return sorted((j for j in self.jobs.values() if j.experiment_id == experiment_id
                       and (states is None or j.state in states)), key=lambda j: j.trial)

    def submit(self, team, manifest_source, *, job_id, experiment_id, trial, gated=False, **_):  # noqa: ANN001
        self.calls.append(("submit", trial, gated))
        self.jobs[job_id] = JobRecord(id=job_id, team=team, state=JobState.QUEUED, experiment_id=experiment_id,
                                      trial=trial, gate=GATE_CLOSED if gated else "")

    def open_gate(self, job_id: str, actor: str) -> JobRecord | None:
        job = self.jobs[job_id]
        self.calls.append(("open", job.trial))
        if job.gate != GATE_CLOSED:
            return None
        self.jobs[job_id] = job.model_copy(update={"gate": GATE_OPEN})
        return self.jobs[job_id]

    def cancel(self, team: str, job_id: str, actor: str) -> None:
        self.calls.append(("cancel", self.jobs[job_id].trial))
        self.jobs[job_id] = self.jobs[job_id].model_copy(update={"state": JobState.CANCELLED})

    def halt(self, team: str, job_id: str, actor: str) -> None:
        self.calls.append(("halt", self.jobs[job_id].trial))

    def resume(self, team: str, job_id: str, actor: str) -> None:
        self.calls.append(("resume", self.jobs[job_id].trial))


class Experiments:
    """The ExperimentStore calls a pass makes, on one record."""

    def __init__(self, record: ExperimentRecord):
        self.record = record
        self.settled: list[ExperimentState] = []

    def find(self, experiment_id: str) -> ExperimentRecord:
        return self.record

    def set_trial(self, experiment_id: str, index: int, **fields) -> None:  # noqa: ANN003
        trials = dict(self.record.trials)
        trials[index] = trials.get(index, TrialProgress()).model_copy(update=fields)
        self.record = self.record.model_copy(update={"trials": trials})

    def settle(self, experiment_id: str, state: ExperimentState) -> None:
        self.settled.append(state)

    def move(self, experiment_id, to, reason, *, only_from):  # noqa: ANN001
        self.record = self.record.model_copy(update={"state": to, "reason": reason})
        return self.record

    def set_best(self, experiment_id: str, best: int | None) -> None:
        pass


def experiment(trials: int = 5, state: ExperimentState = ExperimentState.EXPERIMENT_RUNNING,
               **sweep: object) -> ExperimentRecord:
    spec = parse_experiment({"kind": "experiment", "name": "s", "command": "python t.py {{i}}",
                             "parameters": {"i": list(range(trials))}, "mode": "grid", **sweep})
    return ExperimentRecord(id=EXP, team="t", state=state, spec=spec.model_dump(mode="json"),
                            plan=tuple({"i": i} for i in range(trials)), trial_count=trials)


def trial(index: int, state: JobState, gate: str = "") -> JobRecord:
    return JobRecord(id=f"{EXP}-{index}", team="t", state=state, experiment_id=EXP, trial=index, gate=gate)


def run_pass(exp: ExperimentRecord, jobs: list[JobRecord]) -> tuple[Jobs, Experiments]:
    store, experiments = Jobs(jobs), Experiments(exp)
    driver = ExperimentDriver(experiments, store, store, None)  # type: ignore[arg-type]
    driver.advance(experiments.record)
    return store, experiments


def test_a_new_experiment_fills_its_slots_and_prestarts_one_trial_gated():
    store, _ = run_pass(experiment(max_parallel=2, prestart=1), [])
    assert store.calls == [("submit", 0, False), ("submit", 1, False), ("submit", 2, True)]


def test_the_default_prestart_is_one_and_zero_turns_it_off():
    assert experiment().parsed().prestart == 1
    store, _ = run_pass(experiment(max_parallel=2, prestart=0), [])
    assert store.calls == [("submit", 0, False), ("submit", 1, False)]


def test_nothing_changes_while_the_slots_are_busy_and_a_trial_is_held():
    jobs = [trial(0, JobState.RUNNING), trial(1, JobState.DEPLOYING), trial(2, JobState.DEPLOYING, GATE_CLOSED)]
    store, _ = run_pass(experiment(max_parallel=2, prestart=1), jobs)
    assert store.calls == []


def test_a_freed_slot_opens_the_held_trials_gate_and_the_next_trial_is_prestarted():
    jobs = [trial(0, JobState.STORING), trial(1, JobState.RUNNING), trial(2, JobState.DEPLOYING, GATE_CLOSED)]
    store, _ = run_pass(experiment(max_parallel=2, prestart=1), jobs)
    assert store.calls == [("open", 2), ("submit", 3, True)]
    assert sum(holds_slot(j) for j in store.jobs.values()) == 2
    assert sum(behind_gate(j) for j in store.jobs.values()) == 1


def test_two_freed_slots_open_the_held_trial_and_submit_one_ungated():
    jobs = [trial(0, JobState.COMPLETED), trial(1, JobState.STORING), trial(2, JobState.DEPLOYING, GATE_CLOSED)]
    store, _ = run_pass(experiment(max_parallel=2, prestart=1), jobs)
    assert store.calls == [("open", 2), ("submit", 3, False), ("submit", 4, True)]


def test_a_held_trial_still_queued_gets_its_gate_opened_too():
    jobs = [trial(0, JobState.COMPLETED), trial(1, JobState.QUEUED, GATE_CLOSED)]
    store, _ = run_pass(experiment(max_parallel=1, prestart=1), jobs)
    assert store.calls == [("open", 1), ("submit", 2, True)]


def test_an_opened_gate_holds_a_slot():
    jobs = [trial(0, JobState.DEPLOYING, GATE_OPEN), trial(1, JobState.DEPLOYING, GATE_CLOSED)]
    store, _ = run_pass(experiment(max_parallel=1, prestart=1), jobs)
    assert store.calls == []


def test_a_gate_a_concurrent_pass_opened_first_still_takes_the_slot():
    store = Jobs([trial(0, JobState.COMPLETED), trial(1, JobState.DEPLOYING, GATE_CLOSED)])
    mine = store.open_gate

    def raced(job_id: str, actor: str) -> JobRecord | None:
        mine(job_id, actor)  # the other pass's compare-and-set wins ...
        return mine(job_id, actor)  # ... so this pass's finds the gate open: None

    store.open_gate = raced  # type: ignore[method-assign]
    experiments = Experiments(experiment(max_parallel=1, prestart=1))
    ExperimentDriver(experiments, store, store, None).advance(experiments.record)  # type: ignore[arg-type]
    assert [c for c in store.calls if c[0] == "submit"] == [("submit", 2, True)]  # no second trial in the slot


def test_a_gated_trial_a_backend_ran_anyway_holds_its_slot():
    # a backend that does not honour gates (the simulated one) reports RUNNING: max_parallel still holds
    job = trial(1, JobState.RUNNING, GATE_CLOSED)
    assert holds_slot(job) and not behind_gate(job)
    store, _ = run_pass(experiment(max_parallel=1, prestart=1), [trial(0, JobState.STORING), job])
    assert store.calls == [("submit", 2, True)]


def test_halting_the_experiment_cancels_a_held_trial_and_halts_the_running_one():
    jobs = [trial(0, JobState.RUNNING), trial(1, JobState.DEPLOYING, GATE_CLOSED)]
    store, experiments = run_pass(experiment(max_parallel=1, prestart=1, state=ExperimentState.EXPERIMENT_HALTED),
                                  jobs)
    assert sorted(store.calls) == [("cancel", 1), ("halt", 0)]
    assert experiments.record.progress(1).gen == 1 and experiments.record.progress(0).held


def test_cancelling_the_experiment_cancels_the_held_trial_with_the_rest():
    jobs = [trial(0, JobState.RUNNING), trial(1, JobState.DEPLOYING, GATE_CLOSED)]
    store, _ = run_pass(experiment(max_parallel=1, prestart=1, state=ExperimentState.EXPERIMENT_CANCELLED), jobs)
    assert sorted(store.calls) == [("cancel", 0), ("cancel", 1)]


def test_the_last_trials_are_not_prestarted_past_the_plan():
    jobs = [trial(i, JobState.COMPLETED) for i in range(4)] + [trial(4, JobState.DEPLOYING, GATE_CLOSED)]
    store, _ = run_pass(experiment(max_parallel=2, prestart=1), jobs)
    assert store.calls == [("open", 4)]


def test_prestart_above_max_parallel_is_refused_naming_the_field():
    with pytest.raises(InvalidArgument) as e:
        experiment(max_parallel=1, prestart=2)
    assert "prestart" in e.value.message and "max_parallel" in e.value.message
    with pytest.raises(InvalidArgument) as e:
        experiment(prestart=-1)
    assert any(d["field"] == "prestart" for d in e.value.details)


# -- the hand-over: a freed slot goes to the held trial in the transition that freed it -------------------------


def driver_on(exp: ExperimentRecord, jobs: list[JobRecord]) -> tuple[ExperimentDriver, Jobs]:
    store = Jobs(jobs)
    return ExperimentDriver(Experiments(exp), store, store, None), store  # type: ignore[arg-type]


def test_a_trial_leaving_its_slot_opens_the_held_trials_gate_at_once_and_nothing_else():
    jobs = [trial(0, JobState.STORING), trial(1, JobState.RUNNING), trial(2, JobState.DEPLOYING, GATE_CLOSED)]
    driver, store = driver_on(experiment(max_parallel=2, prestart=1), jobs)
    opened = driver.hand_over(store.jobs[f"{EXP}-0"])
    assert opened is not None and opened.trial == 2 and store.calls == [("open", 2)]  # the next prestart: the pass's
    assert sum(holds_slot(j) for j in store.jobs.values()) == 2


def test_a_hand_over_never_opens_a_gate_while_the_slots_are_full():
    # trial 0's STORING was handed over already (trial 2's gate is open): trial 3 stays held
    jobs = [trial(0, JobState.STORING), trial(1, JobState.RUNNING), trial(2, JobState.DEPLOYING, GATE_OPEN),
            trial(3, JobState.DEPLOYING, GATE_CLOSED)]
    driver, store = driver_on(experiment(max_parallel=2, prestart=1), jobs)
    assert driver.hand_over(store.jobs[f"{EXP}-0"]) is None and store.calls == []
    # a stale event: the trial is back in a slot (restarting) and both slots are busy
    jobs = [trial(0, JobState.RESTARTING), trial(1, JobState.RUNNING), trial(2, JobState.DEPLOYING, GATE_CLOSED)]
    driver, store = driver_on(experiment(max_parallel=2, prestart=1), jobs)
    assert driver.hand_over(trial(0, JobState.STORING)) is None and store.calls == []


@pytest.mark.parametrize("case", ["early stopping", "resume with the experiment", "halted", "no prestart"])
def test_a_hand_over_leaves_to_the_pass_what_the_pass_decides_first(case):
    sweep: dict = {"max_parallel": 1, "prestart": 0 if case == "no prestart" else 1}
    if case == "early stopping":
        sweep["early_stopping"] = {"asha": {"resource": "step", "min_resource": 1, "reduction_factor": 3,
                                            "max_resource": 9}}
        sweep["objective"] = {"metric": "loss", "goal": "minimize"}
    state = ExperimentState.EXPERIMENT_HALTED if case == "halted" else ExperimentState.EXPERIMENT_RUNNING
    exp = experiment(state=state, **sweep)
    jobs = [trial(0, JobState.STORING), trial(1, JobState.DEPLOYING, GATE_CLOSED)]
    if case == "resume with the experiment":
        exp = exp.model_copy(update={"trials": {3: TrialProgress(held=True)}})
        jobs.append(trial(3, JobState.HALTED))
    driver, store = driver_on(exp, jobs)
    assert driver.hand_over(store.jobs[f"{EXP}-0"]) is None and store.calls == []


def test_a_hand_over_and_a_pass_never_spend_one_freed_slot_twice():
    jobs = [trial(0, JobState.STORING), trial(1, JobState.DEPLOYING, GATE_CLOSED)]
    exp = experiment(max_parallel=1, prestart=1)
    driver, store = driver_on(exp, jobs)
    reading, go_on = threading.Event(), threading.Event()
    read = store.of_experiment

    def slow_read(experiment_id: str, states: frozenset[JobState] | None = None) -> list[JobRecord]:
        found = read(experiment_id, states)
        if threading.current_thread().name == "pass":
            reading.set()
            go_on.wait(10)
        return found

    store.of_experiment = slow_read  # type: ignore[method-assign]
    passing = threading.Thread(target=driver.advance, args=(exp,), name="pass")
    passing.start()
    assert reading.wait(10)
    assert driver.hand_over(store.jobs[f"{EXP}-0"], wait=0.05) is None  # the pass is deciding: left to it
    handing = threading.Thread(target=lambda: results.append(driver.hand_over(store.jobs[f"{EXP}-0"])))
    results: list = []
    handing.start()
    go_on.set()
    passing.join(10)
    handing.join(10)
    # the pass opened trial 1's gate and prestarted trial 2; the hand-over, after it, found no free slot
    assert results == [None]
    assert [c for c in store.calls if c[0] == "open"] == [("open", 1)]
    assert sum(holds_slot(j) for j in store.jobs.values()) == 1


def test_only_a_trial_leaving_its_slot_hands_it_over():
    wake = threading.Event()
    rule = TrialChanged(wake)
    handed: list[int] = []
    rule.hand_over = lambda job: handed.append(job.trial)
    rule.after(JobState.RUNNING, trial(0, JobState.STORING), None)
    rule.after(JobState.RUNNING, trial(1, JobState.FAILED), None)
    rule.after(JobState.STORING, trial(2, JobState.COMPLETED), None)  # its slot was handed over at STORING
    rule.after(JobState.DEPLOYING, trial(3, JobState.RUNNING), None)
    rule.after(JobState.RUNNING, JobRecord(id="plain", team="t", state=JobState.STORING), None)  # not a trial
    assert handed == [0, 1] and wake.is_set()

"""ASHA's decisions (services/trainer/experiments/asha.py) on a scripted metric stream, against the paper's rule.

Li et al. 2018, Algorithm 2: a trial that reaches rung k goes on only if it is
among the top floor(|R_k| / eta) results recorded at rung k (and was not
promoted from k before); otherwise it waits (here: halted) and is promoted
later once enough trials reached rung k to put it in that top set.
"""

from __future__ import annotations

from trainforge_services.common.contracts.experiments import Asha, Goal, Objective
from trainforge_services.trainer.experiments import asha
from trainforge_services.trainer.experiments.asha import TrialRungs

LOSS = Objective(metric="loss", goal=Goal.MINIMIZE)
ACC = Objective(metric="acc", goal=Goal.MAXIMIZE)
LADDER = Asha(resource="step", min_resource=1, reduction_factor=3, max_resource=27)


def test_rungs_grow_by_the_reduction_factor_below_max_resource():
    assert LADDER.rungs() == [1, 3, 9]
    assert Asha(min_resource=2, reduction_factor=2, max_resource=20).rungs() == [2, 4, 8, 16]


def test_reached_takes_the_objective_at_the_first_report_at_or_past_each_rung():
    stream = [(0.5, 2.0), (1.0, 1.5), (2.0, 1.2), (4.0, 0.9), (12.0, 0.4)]
    assert asha.reached(stream, [1, 3, 9]) == {0: 1.5, 1: 0.9, 2: 0.4}
    assert asha.reached([(0.5, 2.0)], [1, 3, 9]) == {}


class Driver:
    """Replays arrivals at rungs in order, deciding as the experiment driver does; records every decision."""

    def __init__(self, objective: Objective, ladder: Asha = LADDER):
        self.objective, self.ladder = objective, ladder
        self.trials: dict[int, TrialRungs] = {}
        self.log: list[tuple] = []

    def arrive(self, trial: int, rung: int, value: float) -> bool:
        t = self.trials.get(trial, TrialRungs())
        self.trials[trial] = TrialRungs(values={**t.values, rung: value}, stopped_at=None)
        go = asha.continues(self.trials, trial, rung, self.objective, self.ladder)
        if not go:
            self.trials[trial] = TrialRungs(values=self.trials[trial].values, stopped_at=rung)
        self.log.append(("continue" if go else "stop", trial, rung))
        return go

    def promote(self) -> list[tuple[int, int]]:
        found = asha.promotable(self.trials, self.objective, self.ladder)
        for trial, _rung in found:
            self.trials[trial] = TrialRungs(values=self.trials[trial].values, stopped_at=None)
        return found


def test_scripted_stream_minimize_follows_the_paper():
    d = Driver(LOSS)
    # the first eta-1 arrivals at rung 0 have no top set yet (floor(|R|/3) == 0): they stop
    assert d.arrive(0, 0, 0.9) is False
    assert d.arrive(1, 0, 0.5) is False
    # third arrival: |R_0| = 3, top 1 is trial 1 (0.5); trial 2 (0.7) is not in it
    assert d.arrive(2, 0, 0.7) is False
    assert d.promote() == [(1, 0)]  # get_job: trial 1 is now promotable from rung 0
    assert d.promote() == []  # promoted once only
    # a fourth, better trial: |R_0| = 4, top 1 = itself
    assert d.arrive(3, 0, 0.2) is True
    # a fifth, worse: top 1 is trial 3
    assert d.arrive(4, 0, 0.6) is False
    # sixth: |R_0| = 6, top 2 = trials 3 (0.2) and 1 (0.5): the sixth (0.4) enters the top 2 and continues;
    # top 2 is then {3: 0.2, 5: 0.4}; trial 1 was already promoted
    assert d.arrive(5, 0, 0.4) is True
    assert d.promote() == []
    # at rung 1: trial 1 arrives first (|R_1| = 1): stops, then 3 and 5
    assert d.arrive(1, 1, 0.45) is False
    assert d.arrive(3, 1, 0.15) is False  # |R_1| = 2: floor(2/3) == 0
    assert d.arrive(5, 1, 0.35) is False  # |R_1| = 3: top 1 is trial 3, not 5
    assert d.promote() == [(3, 1)]
    assert d.log[:3] == [("stop", 0, 0), ("stop", 1, 0), ("stop", 2, 0)]


def test_stopped_trials_are_promoted_highest_rung_first():
    d = Driver(LOSS)
    for trial, value in enumerate([0.9, 0.8, 0.7]):
        d.arrive(trial, 0, value)
    # a rung-1 ladder too: three trials stopped there
    d.trials.update({10: TrialRungs(values={0: 0.1, 1: 0.05}, stopped_at=1),
                     11: TrialRungs(values={0: 0.1, 1: 0.2}, stopped_at=1),
                     12: TrialRungs(values={0: 0.1, 1: 0.3}, stopped_at=1)})
    # rung 0 now holds 6 results: top 2 are 10, 11 (0.1, already past rung 0: not stopped there)
    assert d.promote() == [(10, 1)]


def test_maximize_ranks_the_largest_first():
    d = Driver(ACC)
    assert [d.arrive(i, 0, v) for i, v in enumerate([0.5, 0.6, 0.9])] == [False, False, True]
    assert d.arrive(3, 0, 0.7) is False  # |R_0| = 4, top 1 = trial 2 (0.9)
    assert d.promote() == []  # trial 2 already continued


def test_a_full_stream_keeps_about_one_in_eta_per_rung():
    d = Driver(LOSS, Asha(min_resource=1, reduction_factor=3, max_resource=10))
    values = [0.5, 0.1, 0.9, 0.3, 0.8, 0.2, 0.7, 0.4, 0.6]  # nine trials reach rung 0 in this order
    for i, v in enumerate(values):
        d.arrive(i, 0, v)
        d.promote()
    passed = [i for i, t in d.trials.items() if t.stopped_at is None]
    # at the end, exactly floor(9/3) = 3 trials passed rung 0, and they are the best three
    assert sorted(passed) == sorted(sorted(range(9), key=lambda i: values[i])[:3])

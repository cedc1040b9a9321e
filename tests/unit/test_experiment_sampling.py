"""The sampler (services/common/contracts/sampling.py): Hyper's rule, the draws' distributions, grid mode, seeds."""

from __future__ import annotations

import collections
import math
import random

import pytest

from trainforge_services.common.contracts.experiments import Range, Sampling, parse_experiment
from trainforge_services.common.contracts.sampling import balanced, draw, plan_trials, trial_manifest
from trainforge_services.common.errors import InvalidArgument


def spec(parameters: dict, **extra):
    return parse_experiment({"name": "sweep", "command": "python train.py", "parameters": parameters, **extra})


def ks_statistic(samples: list[float], cdf) -> float:  # noqa: ANN001
    """Kolmogorov-Smirnov D: the largest gap between the empirical CDF and `cdf`."""
    xs = sorted(samples)
    n = len(xs)
    return max(max((i + 1) / n - cdf(x), cdf(x) - i / n) for i, x in enumerate(xs))


def ks_critical(n: int, alpha: float = 0.01) -> float:
    """The asymptotic critical value c(alpha) / sqrt(n), c = sqrt(-ln(alpha / 2) / 2)."""
    return math.sqrt(-math.log(alpha / 2) / 2) / math.sqrt(n)


@pytest.mark.parametrize(("n", "values"), [(12, {"bs": [16, 32, 64]}), (7, {"bs": [16, 32, 64]}),
                                           (10, {"bs": [16, 32], "opt": ["sgd", "adam", "lamb"]}),
                                           (3, {"bs": [16, 32], "opt": ["sgd", "adam", "lamb"]}),
                                           (100, {"a": [1, 2, 3], "b": [True, False], "c": ["x", "y", "z"]})])
def test_hypers_rule_every_combination_appears_floor_or_ceil_of_n_over_k(n, values):
    trials = plan_trials(spec(values, samples=n))
    assert len(trials) == n
    k = math.prod(len(v) for v in values.values())
    counts = collections.Counter(tuple(t[name] for name in values) for t in trials)
    every = collections.Counter({combo: counts.get(combo, 0) for combo in _product(values)})
    assert len(every) == k
    assert set(every.values()) <= {n // k, -(-n // k)}, every
    # minimal repetition: the extras are n mod k distinct combinations
    assert sum(1 for c in every.values() if c == -(-n // k)) == (n % k if n % k else k)


def _product(values: dict) -> list[tuple]:
    combos: list[tuple] = [()]
    for options in values.values():
        combos = [c + (o,) for c in combos for o in options]
    return combos


def test_balanced_is_minimal_for_every_n_up_to_three_rounds():
    combos = [(i,) for i in range(5)]
    for n in range(1, 16):
        counts = collections.Counter(balanced(combos, n, random.Random(n)))
        assert max(counts.values(), default=0) - min((counts.get(c, 0) for c in combos), default=0) <= 1


def test_continuous_draws_are_in_range_and_uniform_by_a_ks_test():
    r = Range(range=(0.1, 0.3), sampling=Sampling.UNIFORM)
    rng = random.Random(7)
    xs = [draw(r, rng) for _ in range(2000)]
    assert all(0.1 <= x <= 0.3 for x in xs)
    d = ks_statistic(xs, lambda x: (x - 0.1) / 0.2)
    assert d < ks_critical(len(xs))


def test_log_uniform_draws_follow_the_log_uniform_law_and_not_the_uniform_one():
    r = Range(range=(1e-5, 1e-1), sampling=Sampling.LOG_UNIFORM)
    rng = random.Random(11)
    xs = [draw(r, rng) for _ in range(2000)]
    assert all(1e-5 <= x <= 1e-1 for x in xs)
    lo, hi = math.log(1e-5), math.log(1e-1)
    assert ks_statistic(xs, lambda x: (math.log(x) - lo) / (hi - lo)) < ks_critical(len(xs))
    # the test has power: the same draws are far from uniform on the range
    assert ks_statistic(xs, lambda x: (x - 1e-5) / (1e-1 - 1e-5)) > 5 * ks_critical(len(xs))


def test_integer_draws_cover_the_range_evenly_by_a_chi_square_test():
    r = Range(range=(1, 10), sampling=Sampling.INTEGER)
    rng = random.Random(3)
    xs = [draw(r, rng) for _ in range(5000)]
    assert all(isinstance(x, int) and 1 <= x <= 10 for x in xs)
    counts = collections.Counter(xs)
    expected = len(xs) / 10
    chi2 = sum((counts[v] - expected) ** 2 / expected for v in range(1, 11))
    assert chi2 < 27.88  # chi-square, 9 degrees of freedom, p = 0.001


def test_samples_draw_every_continuous_parameter_n_times_matched_with_the_discrete_ones():
    trials = plan_trials(spec({"lr": {"range": "0.001-0.1", "sampling": "log-uniform"}, "bs": [16, 32]},
                              samples=8, seed=5))
    assert len(trials) == 8
    assert len({t["lr"] for t in trials}) == 8
    assert collections.Counter(t["bs"] for t in trials) == {16: 4, 32: 4}


def test_the_same_seed_plans_the_same_trials_and_another_seed_others():
    params = {"lr": {"range": [0.0, 1.0]}, "bs": [16, 32, 64]}
    assert plan_trials(spec(params, samples=10, seed=42)) == plan_trials(spec(params, samples=10, seed=42))
    assert plan_trials(spec(params, samples=10, seed=42)) != plan_trials(spec(params, samples=10, seed=43))


def test_grid_mode_is_exhaustive_and_enumerates_integer_ranges():
    trials = plan_trials(spec({"bs": [16, 32], "layers": {"range": "2-4", "sampling": "int"}, "opt": ["a", "b"]},
                              mode="grid"))
    combos = {(t["bs"], t["layers"], t["opt"]) for t in trials}
    assert len(trials) == len(combos) == 2 * 3 * 2
    assert combos == {(b, n, o) for b in (16, 32) for n in (2, 3, 4) for o in ("a", "b")}


def test_grid_mode_refuses_a_continuous_range_naming_it():
    with pytest.raises(InvalidArgument) as e:
        plan_trials(spec({"lr": {"range": "0.1-0.3"}}, mode="grid"))
    assert e.value.details[0]["field"] == "parameters.lr"


def test_trial_manifest_fills_the_command_and_env_and_passes_values_as_env():
    s = parse_experiment({"name": "sweep", "command": "python train.py --lr {{lr}} --bs {{ bs }}",
                          "env": {"NOTE": "lr={{lr}}"}, "parameters": {"lr": [0.5], "bs": [8]}, "retries": 2})
    m = trial_manifest(s, 3, {"lr": 0.5, "bs": 8}, "x-abc")
    assert m.rendered_command() == "python train.py --lr 0.5 --bs 8"
    assert m.env["NOTE"] == "lr=0.5" and m.env["PARAM_LR"] == "0.5" and m.env["PARAM_BS"] == "8"
    assert m.labels == {"experiment": "x-abc", "trial": "3"}
    assert m.name == "sweep-3" and m.restart.max_restarts == 2

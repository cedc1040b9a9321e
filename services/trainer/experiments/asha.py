"""Asynchronous successive halving (ASHA, Li et al. 2018, Algorithm 2), as pure decisions.

Rung k sits at progress r_k = min_resource * eta^k of the resource metric.
When a trial reaches rung k its objective there is recorded. It goes on to
the next rung only if it is among the top floor(|R_k| / eta) of all results
recorded at rung k so far (itself included) and has not already been
promoted from k; otherwise it stops there, HALTED, so it stays resumable.
A stopped trial is promoted later (resumed) when enough trials have reached
its rung to put it in the top floor(|R_k| / eta) — the paper's `get_job`,
which prefers a promotion (from the highest rung first) to a new trial.

Everything here reads a `Ladder`: per trial, its recorded rung values and
the rung it is stopped at; the driver (services/trainer/experiments/driver.py)
stores those in MongoDB, so a restart replays nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainforge_services.common.contracts.experiments import Asha, Objective


@dataclass(frozen=True)
class TrialRungs:
    """One trial's results by rung index, and the rung it is stopped at (None: not stopped)."""

    values: Mapping[int, float] = field(default_factory=dict)
    stopped_at: int | None = None


Ladder = Mapping[int, TrialRungs]


def reached(points: Sequence[tuple[float, float]], rungs: Sequence[float]) -> dict[int, float]:
    """Rung index -> objective at it, from (progress, objective) points in report order.

    A rung's value is the objective reported with the first point whose
    progress is at or above the rung (a record without the objective takes
    the last objective reported before it).
    """
    out: dict[int, float] = {}
    for progress, value in points:
        for k, r in enumerate(rungs):
            if k not in out and progress >= r:
                out[k] = value
    return out


def _ranked(ladder: Ladder, rung: int, objective: Objective) -> list[int]:
    """Trials with a result at `rung`, best first (ties by trial index, so the order is stable)."""
    scored = [(t.values[rung], i) for i, t in ladder.items() if rung in t.values]
    sign = 1.0 if objective.goal.value == "minimize" else -1.0
    return [i for _, i in sorted(scored, key=lambda p: (sign * p[0], p[1]))]


def top(ladder: Ladder, rung: int, objective: Objective, eta: int) -> list[int]:
    """The promotable set at `rung`: the best floor(|R_rung| / eta) trials."""
    ranked = _ranked(ladder, rung, objective)
    return ranked[:len(ranked) // eta]


def continues(ladder: Ladder, trial: int, rung: int, objective: Objective, asha: Asha) -> bool:
    """Whether `trial`, having just recorded its result at `rung` (in `ladder`), goes on past it."""
    return trial in top(ladder, rung, objective, asha.reduction_factor)


def promotable(ladder: Ladder, objective: Objective, asha: Asha) -> list[tuple[int, int]]:
    """(trial, rung) of stopped trials that are now in their rung's top set, highest rung first."""
    out = []
    stopped = {i: t.stopped_at for i, t in ladder.items() if t.stopped_at is not None}
    for rung in sorted(set(stopped.values()), reverse=True):
        best = top(ladder, rung, objective, asha.reduction_factor)
        out += [(i, rung) for i in best if stopped.get(i) == rung]
    return out

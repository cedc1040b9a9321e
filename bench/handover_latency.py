"""The Trainer's part of a slot's handover, with and without the hand-over, alternating in one Trainer.

A real Trainer (its store on the MongoDB-wire test server, the metrics index on the OpenSearch-compatible
one, the scripted LCM of the integration tests) runs experiments of N trials, `max_parallel` 1, `prestart` 1,
no objective. This script plays each trial's monitor: it reports RUNNING, then STORING, and times from the
STORING report's call to the moment the next (held) trial's gate is open in the store. Rounds alternate
between the hand-over (`ExperimentDriver.hand_over`, called by the `TrialChanged` rule in the transition)
and the pass alone (the rule's hand-over unset: the gate is opened by the driver pass the transition wakes).

Usage: .venv/bin/python bench/handover_latency.py [--trials 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _stack import machine_line

from tests import servers
from tests.integration.test_trainer_experiments import Env, sweep
from trainforge_services.common.states import JobState
from trainforge_services.trainer.experiments.driver import TrialChanged


def one_experiment(env: Env, trials: int) -> list[float]:
    """Seconds from each STORING report's call to the next trial's gate open in the store."""
    exp = env.submit(sweep(max_parallel=1, mode="grid", prestart=1, objective=None,
                           parameters={"i": list(range(trials))}, command="python t.py {{i}}"))
    ids = [f"{exp.id}-{i}" for i in range(trials)]
    took = []
    for index, job_id in enumerate(ids):
        env.run(job_id)
        if index + 1 < trials:
            servers.wait_for(lambda: (j := env.job(ids[index + 1])) is not None and j.gate == "closed",  # noqa: B023
                             30, f"trial {index + 1} prestarted")
        started = time.perf_counter()
        env.storing(job_id)
        if index + 1 < trials:
            servers.wait_for(lambda: env.job(ids[index + 1]).gate == "open", 30, "the gate to open",  # noqa: B023
                             interval=0.001)
            took.append(time.perf_counter() - started)
        env.complete(job_id)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    mongo, osmem = servers.start_mongo(), servers.start_osmem()
    results: dict[str, list[float]] = {"hand-over": [], "pass alone": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = Env(mongo, osmem, "handover", Path(tmp))
            try:
                rule = next(r for r in env.trainer.core.lifecycle.rules_for(JobState.RUNNING, JobState.STORING)
                            if isinstance(r, TrialChanged))
                hand_over = rule.hand_over
                for r in range(args.rounds):
                    order = ("hand-over", "pass alone") if r % 2 == 0 else ("pass alone", "hand-over")
                    for mode in order:
                        rule.hand_over = hand_over if mode == "hand-over" else None
                        results[mode] += one_experiment(env, args.trials)
            finally:
                env.close()
    finally:
        mongo.cleanup()
        osmem.cleanup()
    print(machine_line())
    print(f"{args.rounds} round(s) of {args.trials} trials each way, max_parallel 1, prestart 1; from the STORING "
          "report's call to the next gate open in the store, ms:")
    for mode, values in results.items():
        print(f"  {mode:12} median {statistics.median(values) * 1000:6.1f}  (min {min(values) * 1000:.1f}, "
              f"max {max(values) * 1000:.1f}, n {len(values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

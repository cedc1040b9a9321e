"""The Ray Tune peer of bench/sweep_overhead.py; runs under the bench venv's Python (`make bench-venv`).

Starts a private Ray instance in this process (loopback only, `num_cpus` =
the parallelism, no dashboard, its own temp dir, usage stats off), then runs
one Tuner over N trials, a grid over a trial index, whose trainable sleeps S
seconds and reports once; 1 CPU per trial and `max_concurrent_trials` P. It
prints one JSON line: {"startup": s, "fit": s, "trials": n, "errors": k},
where `startup` is `ray.init()` and `fit` is `Tuner.fit()` from its call to
its return; then it shuts Ray down. Usage:

    "$(tools/benchvenv/setup.sh --where)"/bin/python bench/_tune_peer.py TRIALS PARALLEL SECONDS
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time


def main() -> int:
    trials, parallel, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    tmp = tempfile.mkdtemp(prefix="tf-tune-")
    import ray
    from ray import tune

    t0 = time.perf_counter()
    ray.init(num_cpus=parallel, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             _temp_dir=tmp, configure_logging=False)
    startup = time.perf_counter() - t0
    try:
        def trial(config: dict) -> None:
            time.sleep(seconds)
            tune.report({"index": config["i"]})

        tuner = tune.Tuner(
            tune.with_resources(trial, {"cpu": 1}),
            param_space={"i": tune.grid_search(list(range(trials)))},
            tune_config=tune.TuneConfig(max_concurrent_trials=parallel),
            run_config=tune.RunConfig(storage_path=os.path.join(tmp, "results"), verbose=0))
        t0 = time.perf_counter()
        results = tuner.fit()
        fit = time.perf_counter() - t0
        print(json.dumps({"startup": startup, "fit": fit, "trials": len(results), "errors": len(results.errors)}))
        return 0
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

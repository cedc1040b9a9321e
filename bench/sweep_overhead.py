"""Sweep overhead: an experiment of N trials of S seconds each on the embedded stack, against the ideal.

Starts a private embedded stack (`trainforge up` in a temporary state dir),
submits one experiment (grid over a trial index, `max_parallel` P) whose
trials each sleep S seconds, and measures its makespan: from the submit to
the experiment's completion as the API reports it (polled every 0.2 s), and
from the first trial's DEPLOYING to the last trial's COMPLETED (the
Trainer's own stamps). Baselines measured in the same run: the ideal
N * S / P, and the same N commands run bare by a local pool of P processes.
When a bench venv with Ray is present (`--ray-python`, default
`.cache/bench-venv/bin/python`), Ray Tune's makespan for the same trials is
measured too; otherwise that line says it was not measured. Usage:

    .venv/bin/python bench/sweep_overhead.py [--trials 100] [--parallel 2] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainforge.sdk import Client  # noqa: E402

RAY_SCRIPT = textwrap.dedent("""
    import sys, time
    from ray import tune
    import ray
    trials, parallel, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    ray.init(num_cpus=parallel, include_dashboard=False, log_to_driver=False)
    def trial(config):
        time.sleep(seconds)
        tune.report({"done": 1})
    t0 = time.perf_counter()
    tune.Tuner(trial, param_space={"i": tune.grid_search(list(range(trials)))},
               tune_config=tune.TuneConfig(max_concurrent_trials=parallel)).fit()
    print(f"RAY_MAKESPAN {time.perf_counter() - t0:.3f}")
""")


def cli(env: dict, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "trainforge.cli", *args], env=env, check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, timeout=600)


def command(seconds: float) -> str:
    return f"python -c \"import time; time.sleep({seconds})\""


def bare_pool(trials: int, parallel: int, seconds: float) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda _: subprocess.run(command(seconds), shell=True, check=True),  # noqa: S602 - fixed
                      range(trials)))
    return time.perf_counter() - t0


def ray_makespan(python: Path, trials: int, parallel: int, seconds: float) -> float | None:
    if not python.exists():
        return None
    probe = subprocess.run([str(python), "-c", "import ray.tune"], capture_output=True, check=False)
    if probe.returncode != 0:
        return None
    out = subprocess.run([str(python), "-c", RAY_SCRIPT, str(trials), str(parallel), str(seconds)],
                         capture_output=True, text=True, check=False, timeout=3600)
    for line in out.stdout.splitlines():
        if line.startswith("RAY_MAKESPAN "):
            return float(line.split()[1])
    print(f"ray run failed:\n{out.stderr[-2000:]}", file=sys.stderr)
    return None


def platform_makespan(trials: int, parallel: int, seconds: float) -> tuple[float, float, dict]:
    state = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env["TF_STATE_DIR"] = str(state)
    cli(env, "up")
    try:
        cfg = json.loads((state / "config.json").read_text())
        client = Client(cfg["api_url"], cfg["api_key"])
        recipe = {"kind": "experiment", "name": "bench-sweep", "framework": "custom", "command": command(seconds),
                  "resources": {"cpus": 0.5, "memory": "256Mi"},
                  "parameters": {"i": {"range": [0, trials - 1], "sampling": "int"}}, "mode": "grid",
                  "max_parallel": parallel}
        t0 = time.time()
        exp = client.experiments.submit(json.dumps(recipe, indent=1))
        deadline = time.monotonic() + max(600.0, trials * seconds * 20)
        while exp["state"] == "running":
            if time.monotonic() > deadline:
                raise SystemExit(f"experiment {exp['id']} still running after the deadline")
            time.sleep(0.2)
            exp = client.experiments.get(exp["id"])
        end = time.time()
        if exp["state"] != "completed":
            raise SystemExit(f"experiment {exp['id']} ended {exp['state']}: {exp['reason']}")
        starts, ends = [], []
        for trial in exp["trials"]:
            job = client.get(trial["job_id"])
            stamps = {h["to"]: h["timestamp"] for h in job["history"]}
            starts.append(stamps["deploying"])
            ends.append(stamps["completed"])
        return end - t0, max(ends) - min(starts), exp
    finally:
        cli(env, "down")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100, help="trials in the sweep")
    ap.add_argument("--parallel", type=int, default=2, help="trials at once (max_parallel)")
    ap.add_argument("--seconds", type=float, default=1.0, help="how long each trial runs")
    ap.add_argument("--ray-python", type=Path, default=ROOT / ".cache" / "bench-venv" / "bin" / "python",
                    help="an interpreter with ray[tune] installed, for the comparison")
    args = ap.parse_args()
    if args.trials < 1 or args.parallel < 1 or args.seconds <= 0:
        ap.error("--trials and --parallel must be at least 1, --seconds above 0")

    ideal = args.trials * args.seconds / args.parallel
    bare = bare_pool(args.trials, args.parallel, args.seconds)
    submit_to_done, first_to_last, _ = platform_makespan(args.trials, args.parallel, args.seconds)
    ray = ray_makespan(args.ray_python, args.trials, args.parallel, args.seconds)

    print(f"machine: {platform.machine()}, {psutil.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}, "
          "load {:.2f} {:.2f} {:.2f}".format(*psutil.getloadavg()))
    print(f"{args.trials} trials of {args.seconds:g} s, {args.parallel} at once")
    print(f"{'':34}{'makespan s':>11}{'vs ideal':>10}{'vs bare':>9}")
    rows = [("ideal (trials x s / parallel)", ideal), ("bare local pool", bare),
            ("trainforge: submit -> completed", submit_to_done),
            ("trainforge: first deploy -> last done", first_to_last)]
    if ray is not None:
        rows.append(("ray tune (same trials)", ray))
    for name, value in rows:
        print(f"{name:34}{value:11.2f}{(value / ideal - 1) * 100:+9.0f}%{value / bare:9.2f}")
    if ray is None:
        print(f"ray tune: not measured (no interpreter with ray.tune at {args.ray_python})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

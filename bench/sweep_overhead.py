"""Sweep overhead: an experiment of N trials of S seconds each on the embedded stack, against the ideal.

Starts a private embedded stack (`trainforge up` in a temporary state dir),
submits one experiment (grid over a trial index, `max_parallel` P) whose
trials each sleep S seconds, and measures its makespan: from the submit to
the experiment's completion as the API reports it (polled every 0.2 s), and
from the first trial's DEPLOYING to the last trial's COMPLETED (the
Trainer's own stamps). Where a trial's time goes is printed as medians of
its phases (from its status history), with the most trials that ever held a
learner at once. Baselines measured in the same run: the ideal N * S / P,
and the same N commands run bare by a local pool of P processes.

When a bench venv with Ray Tune is present (`make bench-venv`; `--ray-python`,
default `$BENCH_VENV/bin/python` or .cache/bench-venv/bin/python), Ray Tune
runs the same trials in the same run (bench/_tune_peer.py: a private Ray on
loopback with `num_cpus` P, a trainable that sleeps S seconds and reports
once, 1 CPU per trial, `max_concurrent_trials` P): its makespan is
`Tuner.fit()` from call to return, Ray's own start-up (`ray.init()`) printed
apart. Without one, that line says it was not measured. Usage:

    .venv/bin/python bench/sweep_overhead.py [--trials 100] [--parallel 2] [--seconds 1.0] [--ray-python PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _stack import ROOT, bench_python, machine_line, stack

from trainforge.sdk import Client

# a trial's phases, as (name, from-stamp, to-stamp) of its status history ("created": the job's creation)
PHASES = (("created -> deploying", "created", "deploying"), ("deploying -> running", "deploying", "running"),
          ("running -> storing", "running", "storing"), ("storing -> completed", "storing", "completed"))


def command(seconds: float) -> str:
    return f"python -c \"import time; time.sleep({seconds})\""


def bare_pool(trials: int, parallel: int, seconds: float) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda _: subprocess.run(command(seconds), shell=True, check=True),  # noqa: S602 - fixed
                      range(trials)))
    return time.perf_counter() - t0


def tune_peer(python: Path, trials: int, parallel: int, seconds: float) -> dict | str:
    """bench/_tune_peer.py's result, or why Ray Tune was not measured."""
    if not python.exists():
        return f"no bench venv at {python} (make bench-venv)"
    probe = subprocess.run([str(python), "-c", "import ray.tune"], capture_output=True, check=False)
    if probe.returncode != 0:
        return f"{python} cannot import ray.tune (make bench-venv)"
    out = subprocess.run([str(python), str(ROOT / "bench" / "_tune_peer.py"), str(trials), str(parallel),
                          str(seconds)], capture_output=True, text=True, check=False, timeout=3600)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise SystemExit(f"the Ray Tune peer exited {out.returncode}:\n{out.stderr[-3000:]}")
    result = json.loads(lines[-1])
    if result["trials"] != trials or result["errors"]:
        raise SystemExit(f"the Ray Tune peer ran {result['trials']} trials, {result['errors']} with errors")
    return result


def stamps(job: dict) -> dict[str, float]:
    """The first time the job entered each state, and its creation."""
    found = {"created": float(job["created_at"])}
    for event in sorted(job["history"], key=lambda h: h["timestamp"]):
        found.setdefault(event["to"], event["timestamp"])
    return found


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans [start, end) that overlap at one instant."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def platform_makespan(trials: int, parallel: int, seconds: float) -> tuple[float, list[dict[str, float]]]:
    """Submit -> the experiment completed, and each trial's stamps."""
    with stack() as st:
        client = Client(st.api_url, st.api_key)
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
        jobs = [client.get(trial["job_id"]) for trial in exp["trials"]]
        runs = [stamps(job) for job in jobs]
        if len(jobs) != trials or any(j["state"] != "completed" or j.get("attempt", 1) > 1 for j in jobs):
            raise SystemExit(f"expected {trials} trials completed once each, got "
                             f"{[(j['id'], j['state'], j.get('attempt')) for j in jobs]}")
        return end - t0, runs


def phases(runs: list[dict[str, float]], parallel: int) -> list[tuple[str, float]]:
    """Median seconds of each phase, and of a freed slot's refill (a trial's COMPLETED -> the next one created)."""
    rows = [(name, statistics.median(r[b] - r[a] for r in runs)) for name, a, b in PHASES]
    created = sorted(r["created"] for r in runs)
    freed = sorted(r["completed"] for r in runs)
    refill = [created[k] - freed[k - parallel] for k in range(parallel, len(created))]
    if refill:
        rows.append(("a trial completed -> next created", statistics.median(refill)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100, help="trials in the sweep")
    ap.add_argument("--parallel", type=int, default=2, help="trials at once (max_parallel)")
    ap.add_argument("--seconds", type=float, default=1.0, help="how long each trial runs")
    ap.add_argument("--ray-python", type=Path, default=bench_python(),
                    help="an interpreter with ray[tune] installed, for the comparison (make bench-venv)")
    args = ap.parse_args()
    if args.trials < 1 or args.parallel < 1 or args.seconds <= 0:
        ap.error("--trials and --parallel must be at least 1, --seconds above 0")

    ideal = args.trials * args.seconds / args.parallel
    bare = bare_pool(args.trials, args.parallel, args.seconds)
    submit_to_done, runs = platform_makespan(args.trials, args.parallel, args.seconds)
    first_to_last = max(r["completed"] for r in runs) - min(r["deploying"] for r in runs)
    tune = tune_peer(args.ray_python, args.trials, args.parallel, args.seconds)

    print(machine_line())
    print(f"{args.trials} trials of {args.seconds:g} s, {args.parallel} at once")
    print(f"{'':38}{'makespan s':>11}{'vs ideal':>10}{'vs bare':>9}")
    rows = [("ideal (trials x s / parallel)", ideal), ("bare local pool", bare),
            ("trainforge: submit -> completed", submit_to_done),
            ("trainforge: first deploy -> last done", first_to_last)]
    if isinstance(tune, dict):
        rows.append(("ray tune: Tuner.fit()", tune["fit"]))
    for name, value in rows:
        print(f"{name:38}{value:11.2f}{(value / ideal - 1) * 100:+9.0f}%{value / bare:9.2f}")
    if isinstance(tune, dict):
        print(f"ray tune: ray.init() start-up {tune['startup']:.2f} s (not in its makespan)")
    else:
        print(f"ray tune: not measured ({tune})")
    spans = [(r["deploying"], r["completed"]) for r in runs]
    print(f"trainforge trial phases, median s (most trials deploying..completed at once: {most_at_once(spans)}):")
    for name, value in phases(runs, args.parallel):
        print(f"  {name:36}{value:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

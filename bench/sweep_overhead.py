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
default `$BENCH_VENV/bin/python` or the per-user cache's, `bench_python()`), Ray Tune
runs the same trials in the same run (bench/_tune_peer.py: a private Ray on
loopback with `num_cpus` P, a trainable that sleeps S seconds and reports
once, 1 CPU per trial, `max_concurrent_trials` P): its makespan is
`Tuner.fit()` from call to return, Ray's own start-up (`ray.init()`) printed
apart. Without one, that line says it was not measured.

`--prestart 0,1` runs the experiment once per value of its `prestart`
(trials deployed ahead of a free slot, held before their learners), in the
same stack, alternating for `--rounds` rounds (every other round in the
reverse order), so the settings are compared under the same load. The
bare pool runs once per round as well, beside a pool running only the
interpreter's start (`python -c pass`: what of the pool's own overhead is
the trial's interpreter, not the pool). Usage:

    .venv/bin/python bench/sweep_overhead.py [--trials 100] [--parallel 2] [--seconds 1.0] [--prestart 0,1]
        [--rounds 1] [--ray-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _stack import ROOT, bench_python, machine_line, stack

from tests.chaos_support import most_at_once
from trainforge.sdk import Client

# a trial's phases, as (name, from-stamp, to-stamp) of its status history ("created": the job's creation)
PHASES = (("created -> deploying", "created", "deploying"), ("deploying -> running", "deploying", "running"),
          ("running -> storing", "running", "storing"), ("storing -> completed", "storing", "completed"))


def command(seconds: float) -> str:
    return f"python -c \"import time; time.sleep({seconds})\""


def bare_pool(trials: int, parallel: int, seconds: float, cmd: str | None = None) -> float:
    # the same `python` the platform's learners get: their controller puts its interpreter's folder first on PATH
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    t0 = time.perf_counter()
    line = cmd or command(seconds)
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda _: subprocess.run(line, shell=True, check=True, env=env),  # noqa: S602 - fixed
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
        # the figures measured before it still stand; say why this one is missing
        tail = out.stderr.strip().splitlines()[-1:] or ["no output"]
        return f"the Ray Tune peer exited {out.returncode}: {tail[0][:300]}"
    result = json.loads(lines[-1])
    if result["trials"] != trials or result["errors"]:
        return f"the Ray Tune peer ran {result['trials']} trials, {result['errors']} with errors"
    return result


def stamps(job: dict) -> dict[str, float]:
    """The first time the job entered each state, and its creation."""
    found = {"created": float(job["created_at"])}
    for event in sorted(job["history"], key=lambda h: h["timestamp"]):
        found.setdefault(event["to"], event["timestamp"])
    return found


def platform_makespan(client: Client, trials: int, parallel: int, seconds: float,
                      prestart: int) -> tuple[float, list[dict[str, float]]]:
    """Submit -> the experiment completed, and each trial's stamps."""
    recipe = {"kind": "experiment", "name": f"bench-sweep-p{prestart}", "framework": "custom",
              "command": command(seconds), "resources": {"cpus": 0.5, "memory": "256Mi"},
              "parameters": {"i": {"range": [0, trials - 1], "sampling": "int"}}, "mode": "grid",
              "max_parallel": parallel, "prestart": prestart}
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
    # a slot's handover: the k-th learner to start against the (k - parallel)-th to end (STORING)
    started = sorted(r["running"] for r in runs)
    ended = sorted(r["storing"] for r in runs)
    handover = [started[k] - ended[k - parallel] for k in range(parallel, len(started))]
    if handover:
        rows.append(("a learner ended -> next learner running", statistics.median(handover)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100, help="trials in the sweep")
    ap.add_argument("--parallel", type=int, default=2, help="trials at once (max_parallel)")
    ap.add_argument("--seconds", type=float, default=1.0, help="how long each trial runs")
    ap.add_argument("--prestart", default="0,1", help="the experiment's prestart values to compare, e.g. 0,1")
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds of every setting")
    ap.add_argument("--ray-python", type=Path, default=bench_python(),
                    help="an interpreter with ray[tune] installed, for the comparison (make bench-venv)")
    args = ap.parse_args()
    try:
        prestarts = [int(v) for v in args.prestart.split(",")]
    except ValueError:
        ap.error(f"--prestart: {args.prestart!r} is not a comma-separated list of whole numbers")
    if args.trials < 1 or args.parallel < 1 or args.seconds <= 0 or args.rounds < 1:
        ap.error("--trials, --parallel and --rounds must be at least 1, --seconds above 0")
    if any(p < 0 or p > args.parallel for p in prestarts):
        ap.error("--prestart values must lie between 0 and --parallel")

    ideal = args.trials * args.seconds / args.parallel
    bare: list[float] = []
    interp: list[float] = []
    made: dict[int, list[tuple[float, float, list[dict[str, float]]]]] = {p: [] for p in prestarts}
    with stack() as st:
        client = Client(st.api_url, st.api_key)
        for r in range(args.rounds):
            bare.append(bare_pool(args.trials, args.parallel, args.seconds))
            interp.append(bare_pool(args.trials, args.parallel, 0, cmd="python -c pass"))
            # every other round in the reverse order, so a load that rises through a round favours no setting
            for p in prestarts if r % 2 == 0 else prestarts[::-1]:
                submit_to_done, runs = platform_makespan(client, args.trials, args.parallel, args.seconds, p)
                first_to_last = max(r["completed"] for r in runs) - min(r["deploying"] for r in runs)
                made[p].append((submit_to_done, first_to_last, runs))
    print(machine_line())
    print(f"{args.trials} trials of {args.seconds:g} s, {args.parallel} at once, {args.rounds} round(s); "
          "medians over rounds")
    med = statistics.median
    bare_s = med(bare)
    print(f"{'':44}{'makespan s':>11}{'vs ideal':>10}{'vs bare':>9}")
    rows = [("ideal (trials x s / parallel)", ideal), ("bare local pool", bare_s)]
    for p in prestarts:
        rows.append((f"trainforge prestart {p}: submit -> completed", med(m[0] for m in made[p])))
        rows.append((f"trainforge prestart {p}: first deploy -> done", med(m[1] for m in made[p])))
    for name, value in rows:
        print(f"{name:44}{value:11.2f}{(value / ideal - 1) * 100:+9.0f}%{value / bare_s:9.2f}")
    per_trial = med(interp) * args.parallel / args.trials
    print(f"bare pool of `python -c pass` alone: {med(interp):.2f} s, {per_trial:.3f} s per trial per slot; "
          f"the sleeping pool's overhead beyond the ideal: {(bare_s - ideal) * args.parallel / args.trials:.3f} s "
          "per trial per slot")
    if args.rounds > 1:
        print("rounds: bare " + ", ".join(f"{v:.2f}" for v in bare) + "; " + "; ".join(
            f"prestart {p} " + ", ".join(f"{m[0]:.2f}" for m in made[p]) for p in prestarts))
    for p in prestarts:
        runs = made[p][-1][2]
        spans = [(r["deploying"], r["completed"]) for r in runs]
        learners = [(r["running"], r["storing"]) for r in runs]
        print(f"prestart {p}: trial phases of the last round, median s (most trials deploying..completed at once: "
              f"{most_at_once(spans)}, running..storing at once: {most_at_once(learners)}):")
        for name, value in phases(runs, args.parallel):
            print(f"  {name:36}{value:8.2f}")
    sys.stdout.flush()  # the figures above stand even if the peer below takes long or fails
    tune = tune_peer(args.ray_python, args.trials, args.parallel, args.seconds)
    if isinstance(tune, dict):
        value = tune["fit"]
        print(f"{'ray tune: Tuner.fit()':44}{value:11.2f}{(value / ideal - 1) * 100:+9.0f}%{value / bare_s:9.2f}")
        print(f"ray tune: ray.init() start-up {tune['startup']:.2f} s (not in its makespan)")
        print(machine_line())
    else:
        print(f"ray tune: not measured ({tune})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

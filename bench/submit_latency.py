"""Submit latency of the embedded stack against the same command run bare.

Starts a private embedded stack (`trainforge up` in a temporary state dir),
submits N sequential one-learner jobs whose command is a trivial python,
and prints p50/p99 of submit→RUNNING and submit→COMPLETED (from the job's
status history, stamped by the Trainer) next to the wall time of running the
same command directly, as ratios. With `--peer ray`, the same N jobs go
through Ray Jobs on a private single-node Ray cluster in the same run, from
the separate bench venv (`make bench-venv`, in the per-user cache or $BENCH_VENV;
never the project's own environment), and the ratios platform / Ray are printed too.
Usage:

    PYTHONPATH=$PWD .venv/bin/python bench/submit_latency.py [-n 20] [--peer ray]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stack import bench_python, machine_line, pct

from trainforge.sdk import Client

ROOT = Path(__file__).resolve().parents[1]
BENCH_PYTHON = bench_python()
COMMAND = "python -c \"print('hello from a trivial job')\""


def cli(env: dict, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "trainforge.cli", *args], env=env, check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, timeout=300)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=20, help="jobs (and bare runs) to time")
    ap.add_argument("--peer", choices=("ray",), help="also time the same jobs through Ray Jobs (make bench-venv)")
    args = ap.parse_args()
    if args.peer and not BENCH_PYTHON.exists():
        print(f"--peer ray needs {BENCH_PYTHON}: run `make bench-venv` first", file=sys.stderr)
        return 2

    bare = []
    for _ in range(args.n):
        t0 = time.perf_counter()
        subprocess.run(COMMAND, shell=True, check=True, stdout=subprocess.DEVNULL)  # noqa: S602 - fixed command
        bare.append(time.perf_counter() - t0)

    state = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env["TF_STATE_DIR"] = str(state)
    cli(env, "up")
    try:
        cfg = json.loads((state / "config.json").read_text())
        client = Client(cfg["api_url"], cfg["api_key"])
        manifest = {"name": "bench", "framework": "custom", "resources": {"cpus": 0.5, "memory": "256Mi"},
                    "command": COMMAND}
        to_running, to_completed = [], []
        for _ in range(args.n):
            t0 = time.time()
            job = client.submit(manifest)
            deadline = time.monotonic() + 120  # a job stuck in the stack ends the benchmark, not hangs it
            while job["state"] not in ("completed", "failed", "cancelled"):
                if time.monotonic() > deadline:
                    print(f"job {job['id']} still {job['state']} after 120 s", file=sys.stderr)
                    return 1
                time.sleep(0.02)
                job = client.get(job["id"])
            if job["state"] != "completed":
                print(f"job {job['id']} ended {job['state']}: {job['reason']}", file=sys.stderr)
                return 1
            ts = {h["to"]: h["timestamp"] for h in job["history"]}
            to_running.append(ts["running"] - t0)
            to_completed.append(ts["completed"] - t0)
    finally:
        cli(env, "down")

    peer = None
    if args.peer:
        out = subprocess.run([str(BENCH_PYTHON), str(ROOT / "bench" / "_ray_peer.py"), str(args.n), COMMAND],
                             capture_output=True, text=True, timeout=1800, check=False)
        if out.returncode != 0:
            print(f"the Ray peer failed:\n{out.stderr[-3000:]}", file=sys.stderr)
            return 1
        peer = json.loads(out.stdout.strip().splitlines()[-1])

    b50, b99 = pct(bare, 50), pct(bare, 99)
    print(machine_line())
    print(f"{args.n} sequential one-learner jobs, command: {COMMAND}")
    print(f"{'':22}{'p50 s':>9}{'p99 s':>9}{'p50/bare':>10}{'p99/bare':>10}")
    print(f"{'bare command':22}{b50:9.3f}{b99:9.3f}{1:10.1f}{1:10.1f}")
    for name, vals in (("submit -> RUNNING", to_running), ("submit -> COMPLETED", to_completed)):
        p50, p99 = pct(vals, 50), pct(vals, 99)
        print(f"{name:22}{p50:9.3f}{p99:9.3f}{p50 / b50:10.1f}{p99 / b99:10.1f}")
    print(f"mean submit -> COMPLETED {statistics.mean(to_completed):.3f} s")
    if peer is not None:
        for name, ours, theirs in (("submit -> RUNNING", to_running, peer["running"]),
                                   ("submit -> COMPLETED", to_completed, peer["completed"])):
            print(f"Ray Jobs {name:19}{pct(theirs, 50):9.3f}{pct(theirs, 99):9.3f}   Ray / ours p50 "
                  f"{pct(theirs, 50) / pct(ours, 50):.1f}x, p99 {pct(theirs, 99) / pct(ours, 99):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

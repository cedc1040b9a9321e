"""FfDL's experiment repeated: mean job completion time with 10, 20 and 40 concurrent jobs on the local backend.

FfDL (IBM's deep-learning platform) reported that the mean job completion
time grew by 62 % from 10 to 40 concurrent jobs. Here each job is the
example in examples/mnist with one learner at a tiny size (`--train-samples`,
one epoch), a real training run through the whole embedded stack (API,
Trainer, LCM, job monitor, controller, learner). For each concurrency K the
bench submits K jobs at once from K client threads, waits until all ended,
and takes each job's completion time as submit (its first history entry) ->
COMPLETED. The backend is given room for every job at once (TF_LOCAL_CPUS,
TF_LOCAL_MAX_LEARNERS), so what grows with K is contention for the machine,
not time in the queue. Baseline in the same run: the same training command
run bare, alone. Usage:

    PYTHONPATH=$PWD .venv/bin/python bench/ffdl_jct.py [--sizes 10,20,40] [--train-samples 300]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _stack import ROOT, TERMINAL, machine_line, stack

from trainforge.sdk import Client

EXAMPLE = ROOT / "examples" / "mnist"


def jct(client: Client, manifest: dict, k: int, timeout: float) -> list[float]:
    """Submit k jobs at once; each one's submit -> COMPLETED seconds (an error if any did not complete)."""
    with ThreadPoolExecutor(k) as pool:
        ids = [job["id"] for job in pool.map(lambda i: client.submit(manifest), range(k))]
    deadline = time.monotonic() + timeout
    pending, done = set(ids), {}
    while pending:
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(pending)} of {k} jobs still running after {timeout:.0f} s")
        for job_id in list(pending):
            job = client.get(job_id)
            if job["state"] in TERMINAL:
                done[job_id] = job
                pending.discard(job_id)
        time.sleep(0.5)
    bad = [j for j in done.values() if j["state"] != "completed"]
    if bad:
        raise SystemExit(f"{len(bad)} of {k} jobs did not complete; first: {bad[0]['id']} {bad[0]['state']}: "
                         f"{bad[0]['reason']}")
    return [j["history"][-1]["timestamp"] - j["history"][0]["timestamp"] for j in done.values()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,20,40", help="concurrent jobs, comma-separated")
    ap.add_argument("--train-samples", type=int, default=300)
    ap.add_argument("--test-samples", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds each round may take")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    script = ["--epochs", "1", "--seed", "0", "--train-samples", str(args.train_samples),
              "--test-samples", str(args.test_samples)]

    work = Path(tempfile.mkdtemp(prefix="tf-bare-"))  # a copy: the run leaves checkpoints and results behind
    try:
        shutil.copytree(EXAMPLE, work, dirs_exist_ok=True, ignore=shutil.ignore_patterns("results", "checkpoints"))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "train.py", *script], cwd=work, check=True, capture_output=True)
        bare = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)

    manifest = {"name": "ffdl-jct", "framework": "torch", "learners": 1,
                "resources": {"cpus": 0.05, "memory": "256Mi"}, "command": "python train.py " + " ".join(script),
                "code": str(EXAMPLE), "outputs": "results/"}
    extra = {"TF_RATE_LIMIT_PER_SECOND": "0", "TF_LOCAL_CPUS": "1000", "TF_LOCAL_MEMORY": str(2**44),
             "TF_LOCAL_MAX_LEARNERS": str(max(sizes))}
    results: dict[int, list[float]] = {}
    print(machine_line())
    print(f"examples/mnist, 1 learner, {' '.join(script)}; K jobs submitted at once, all admitted at once")
    print(f"bare command alone            {bare:8.2f} s", flush=True)
    with stack(extra) as st:
        client = Client(st.api_url, st.api_key, timeout=120)
        for k in sizes:  # each round printed as it ends, so a long run leaves what it measured
            v = results[k] = jct(client, manifest, k, args.timeout)
            print(f"K={k:<3} JCT mean {statistics.mean(v):7.2f} s  median {statistics.median(v):7.2f} s  "
                  f"min {min(v):6.2f}  max {max(v):6.2f}   (load average after: {os.getloadavg()[0]:.1f})",
                  flush=True)
        client.close()
    lo, hi = sizes[0], sizes[-1]
    ratio = statistics.mean(results[hi]) / statistics.mean(results[lo])
    print(f"mean JCT K={hi} / K={lo}        {ratio:8.2f}x  ({(ratio - 1) * 100:+.0f} %; FfDL reported +62 % from 10 to 40)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Halt, resume and learner-loss recovery latency of the example job on the embedded stack.

Starts a private embedded stack (`trainforge up` in a temporary state dir)
and, N times, runs the example job (examples/mnist, 2 learners, DDP over
gloo, a smaller data set) through: submit -> first epoch done -> halt ->
HALTED -> resume -> RUNNING -> SIGKILL of one learner -> RUNNING again as the
next attempt -> COMPLETED. Times come from the job's status history (stamped
by the Trainer) and the moments this script acted; they are printed next to
the time one epoch of the example takes on the same machine in the same run
(ratios), so the figures say how much of a training epoch each operation
costs. Usage:

    .venv/bin/python bench/halt_resume.py [-n 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from trainforge.sdk import Client

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mnist"
MANIFEST = {
    "name": "bench-halt", "framework": "torch", "learners": 2, "resources": {"cpus": 1, "memory": "2Gi"},
    "command": "python train.py --epochs 3 --seed 0 --train-samples 2400 --test-samples 400",
    "code": str(EXAMPLE), "outputs": "results/", "checkpoint": {"interval": "5s"},
    "restart": {"max_restarts": 2, "backoff": "1s"},
}
_EPOCH = re.compile(r"^epoch \d+/\d+ .*\((\d+(?:\.\d+)?)s\)$")


def cli(env: dict, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "trainforge.cli", *args], env=env, check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, timeout=300)


def wait(client: Client, job_id: str, test, what: str, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(job_id)
        if test(job):
            return job
        if job["state"] in ("completed", "failed", "cancelled"):
            raise RuntimeError(f"job {job_id} ended {job['state']} while waiting for {what}: {job['reason']}")
        time.sleep(0.05)
    raise TimeoutError(f"job {job_id}: no {what} within {timeout}s")


def lines(client: Client, job_id: str) -> list[str]:
    return [line["line"] for line in client.logs(job_id, limit=5000)[0]]


def entered(job: dict, state: str, after: float = 0.0) -> float:
    return min(h["timestamp"] for h in job["history"] if h["to"] == state and h["timestamp"] >= after)


def learner(stack_id: str, job_id: str) -> psutil.Process | None:
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
            if env.get("TF_STACK_ID") == stack_id and env.get("TF_JOB_ID") == job_id and env.get("RANK") == "1" \
                    and "train.py" in " ".join(p.cmdline()):
                return p
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return None


def one_run(client: Client, stack_id: str) -> dict[str, float]:
    job_id = client.submit(MANIFEST)["id"]
    wait(client, job_id, lambda j: any(line.startswith("epoch 1/") for line in lines(client, job_id)),
         "first epoch", 300)
    epoch = next(float(m.group(1)) for line in lines(client, job_id) if (m := _EPOCH.match(line)))

    t_halt = time.time()
    client.halt(job_id)
    job = wait(client, job_id, lambda j: j["state"] == "halted", "HALTED")
    halted = entered(job, "halted", t_halt) - t_halt

    t_resume = time.time()
    client.resume(job_id)
    job = wait(client, job_id, lambda j: j["state"] == "running" and j["attempt"] == 2, "RUNNING after resume")
    resumed = entered(job, "running", t_resume) - t_resume

    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        victim = learner(stack_id, job_id)
        time.sleep(0.05)
    if victim is None:
        raise RuntimeError(f"job {job_id}: learner 1 of attempt 2 not found")
    t_kill = time.time()
    victim.send_signal(signal.SIGKILL)
    job = wait(client, job_id, lambda j: j["state"] == "running" and j["attempt"] == 3, "RUNNING after the kill")
    recovered = entered(job, "running", t_kill) - t_kill
    noticed = entered(job, "restarting", t_kill) - t_kill
    job = wait(client, job_id, lambda j: j["state"] == "completed", "COMPLETED", 600)
    return {"epoch": epoch, "halt": halted, "resume": resumed, "noticed": noticed, "recover": recovered,
            "restarts": job["restarts"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=3, help="runs of the whole sequence")
    args = ap.parse_args()

    state = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env["TF_STATE_DIR"] = str(state)
    cli(env, "up")
    runs = []
    try:
        cfg = json.loads((state / "config.json").read_text())
        stack_id = json.loads((state / "stack.json").read_text())["stack_id"]
        client = Client(cfg["api_url"], cfg["api_key"])
        for i in range(args.n):
            runs.append(one_run(client, stack_id))
            print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()), file=sys.stderr)
    finally:
        cli(env, "down")

    print(f"machine: {platform.machine()}, {psutil.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}")
    print(f"{args.n} runs of the example (2 learners, DDP/gloo, 2400 samples), medians:")
    epoch = statistics.median(r["epoch"] for r in runs)
    print(f"{'one training epoch (baseline)':40}{epoch:8.2f} s{1:8.2f}x")
    for key, name in (("halt", "halt request -> HALTED"), ("resume", "resume request -> RUNNING"),
                      ("noticed", "learner SIGKILL -> RESTARTING"), ("recover", "learner SIGKILL -> RUNNING again")):
        value = statistics.median(r[key] for r in runs)
        print(f"{name:40}{value:8.2f} s{value / epoch:8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

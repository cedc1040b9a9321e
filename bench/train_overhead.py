"""The example DDP job under bare torchrun against the same script through the platform, alternating.

Each round runs examples/mnist (2 learners, DDP over gloo) twice, in an
order flipped every round: once as `python -m torch.distributed.run
--nproc-per-node 2 train.py ...` in a copy of the example (wall time from
start to exit), once submitted to a private embedded stack (RUNNING ->
COMPLETED and submit -> COMPLETED from the job's status history). While the
platform's run goes on, the CPU time of its controllers (and their guards)
and of its job monitor is sampled, and reported per learner and as a share of
the learners' own CPU. Prints medians and spreads, and the ratios platform /
bare. Usage:

    PYTHONPATH=$PWD .venv/bin/python bench/train_overhead.py [-r 3] [--epochs 3] [--train-samples 4000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from _stack import ROOT, TERMINAL, machine_line, platform_procs, spread, stack

from trainforge.sdk import Client

EXAMPLE = ROOT / "examples" / "mnist"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_run(args: list[str]) -> float:
    work = Path(tempfile.mkdtemp(prefix="tf-bare-"))
    try:
        shutil.copytree(EXAMPLE, work, dirs_exist_ok=True, ignore=shutil.ignore_patterns("results", "checkpoints"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", str(free_port()), "train.py", *args], cwd=work, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)


class CpuSampler(threading.Thread):
    """Last seen CPU seconds (user + system) of each controller, guard, monitor and learner of a stack."""

    def __init__(self, state: Path):
        super().__init__(daemon=True)
        self.state, self.stop = state, threading.Event()
        self.cpu: dict[tuple[str, int], float] = {}

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for procs in platform_procs(self.state).values():
                for p in procs:
                    try:
                        cmd = " ".join(p.cmdline())
                        role = ("guard" if "guard" in cmd else "monitor" if "jobmonitor" in cmd else "controller")
                        t = p.cpu_times()
                        self.cpu[(role, p.pid)] = t.user + t.system
                        for child in p.children(recursive=True):
                            if "train.py" in " ".join(child.cmdline()):
                                ct = child.cpu_times()
                                self.cpu[("learner", child.pid)] = ct.user + ct.system
                    except psutil.Error:
                        continue

    def total(self, role: str) -> float:
        return sum(v for (r, _), v in self.cpu.items() if r == role)


def platform_run(client: Client, state: Path, args: list[str]) -> tuple[float, float, dict[str, float]]:
    manifest = {"name": "overhead", "framework": "torch", "learners": 2, "resources": {"cpus": 1, "memory": "2Gi"},
                "command": "python train.py " + " ".join(args), "code": str(EXAMPLE), "outputs": "results/"}
    sampler = CpuSampler(state)
    sampler.start()
    t0 = time.time()
    job = client.submit(manifest)
    deadline = time.monotonic() + 1800
    while job["state"] not in TERMINAL:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job['id']} still {job['state']}")
        time.sleep(0.1)
        job = client.get(job["id"])
    sampler.stop.set()
    sampler.join()
    if job["state"] != "completed":
        raise RuntimeError(f"job {job['id']} ended {job['state']}: {job['reason']}")
    ts = {h["to"]: h["timestamp"] for h in job["history"]}
    cpu = {role: sampler.total(role) for role in ("controller", "guard", "monitor", "learner")}
    return ts["completed"] - ts["running"], ts["completed"] - t0, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-r", type=int, default=3, help="rounds (one bare and one platform run each)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--train-samples", type=int, default=4000)
    ap.add_argument("--test-samples", type=int, default=1000)
    args = ap.parse_args()
    script = ["--epochs", str(args.epochs), "--seed", "0", "--train-samples", str(args.train_samples),
              "--test-samples", str(args.test_samples)]

    bare, run, total, cpus = [], [], [], []
    with stack() as st:
        client = Client(st.api_url, st.api_key, timeout=60)
        for i in range(args.r):
            for what in (("bare", "platform") if i % 2 == 0 else ("platform", "bare")):
                if what == "bare":
                    bare.append(bare_run(script))
                else:
                    r, t, c = platform_run(client, st.state, script)
                    run.append(r)
                    total.append(t)
                    cpus.append(c)
        client.close()

    print(machine_line())
    print(f"examples/mnist, 2 learners, {' '.join(script)}; {args.r} rounds, order flipped each round")
    print(f"bare torchrun wall               {spread(bare)} s")
    print(f"platform RUNNING -> COMPLETED    {spread(run)} s")
    print(f"platform submit -> COMPLETED     {spread(total)} s")
    ratios = [r / b for r, b in zip(run, bare, strict=True)]
    print(f"RUNNING -> COMPLETED / bare      median {statistics.median(run) / statistics.median(bare):.3f}x; "
          f"per round {', '.join(f'{x:.2f}' for x in ratios)}")
    print(f"submit -> COMPLETED / bare       median {statistics.median(total) / statistics.median(bare):.3f}x")
    per_learner = [(c["controller"] + c["guard"]) / 2 for c in cpus]
    share = [(c["controller"] + c["guard"]) / c["learner"] for c in cpus if c["learner"] > 0]
    print(f"controller + guard CPU per learner {spread(per_learner)} s; job monitor "
          f"{spread([c['monitor'] for c in cpus])} s; learners' own CPU {spread([c['learner'] for c in cpus])} s")
    if share:
        print(f"controller CPU / learner CPU     {statistics.median(share):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

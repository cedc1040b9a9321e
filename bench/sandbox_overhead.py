"""What the learner sandbox costs: start latency and training overhead, sandbox against none, in one run.

Runs the controller's own launch path (services/controller/learner.py's
guard, with and without services/controller/sandbox/) without etcd or a
stack, alternating sandbox / none for every repetition so that drift in
the machine's load hits both alike:

- start latency: from the moment the controller would start preparing the
  learner (the sandbox's set-up included: the job's network namespace,
  cgroups, chown of the working directory, the config) until the learner's
  first output line reaches the controller (python started inside);
- training: a small CPU model (torch, an MLP on random data, fixed steps)
  timed by the learner itself, and the whole learner's wall time.

Both modes get the same environment (`learner_env`: OMP_NUM_THREADS from
the manifest's cpus, 1 by default) and the same manifest. Keep --cpus at 1
on a busy machine: under cgroup v1 a sandboxed learner's threads share one
scheduling weight, while the threads of an unsandboxed one each compete on
their own, so with several threads and other load the comparison measures
that fairness rule, not the sandbox's cost. As root it measures the root
sandbox; as another user, the sandbox without root (`userns`: the job's
namespace holder started per learner here, no cgroups). Usage:

    PYTHONPATH=$PWD .venv/bin/python bench/sandbox_overhead.py [-n 7] [--steps 300] [--cpus 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainforge_services.common import isolation  # noqa: E402
from trainforge_services.common.contracts.specs import LearnerSpec  # noqa: E402
from trainforge_services.controller.learner import guarded_argv, learner_env  # noqa: E402
from trainforge_services.controller.sandbox import Sandbox  # noqa: E402

TRAIN = """
import time
print("up", flush=True)
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
started = time.perf_counter()
for _ in range({steps}):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
print(f"train {{time.perf_counter() - started:.4f}}", flush=True)
"""


def one_run(root: Path, job: str, sandboxed: bool, steps: int, cpus: float = 1) -> tuple[float, float, float]:
    """(start latency, training seconds, learner wall seconds) of one learner."""
    workdir = root / "work" / job / "1" / "learner-0"
    workdir.mkdir(parents=True)
    (workdir / "train.py").write_text(TRAIN.format(steps=steps))
    spec = LearnerSpec.model_validate({
        "job_id": job, "attempt": 1, "rank": 0, "world_size": 1, "workdir": str(workdir),
        "manifest": {"name": "bench", "command": "python train.py", "resources": {"cpus": cpus, "memory": "2Gi"}}})
    command = spec.manifest.rendered_command()
    t0 = time.perf_counter()
    env = learner_env(spec)
    program = None
    box = None
    if sandboxed:
        box = Sandbox(spec, root, unprivileged=isolation.kind() is isolation.Isolation.USERNS)
        box.prepare()
        env, program = box.env(env), box.argv(command)
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(guarded_argv(command, read_end, sys.executable, program), cwd=workdir, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, pass_fds=(read_end,))
    finally:
        os.close(read_end)
    try:
        first = proc.stdout.readline()
        latency = time.perf_counter() - t0
        if first.strip() != b"up":
            raise RuntimeError(f"unexpected first line {first!r}: {proc.stderr.read()[-2000:]!r}")
        rest, err = proc.communicate(timeout=600)
        wall = time.perf_counter() - t0
        line = next((ln for ln in rest.decode().splitlines() if ln.startswith("train ")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"learner failed ({proc.returncode}): {err.decode()[-2000:]}")
        return latency, float(line.split()[1]), wall
    finally:
        os.close(write_end)
        if box is not None:
            box.cleanup()
            isolation.remove_job(job)
            if box.holder:
                os.kill(box.holder, signal.SIGKILL)


def summary(name: str, values: list[float], unit: str = "s") -> str:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return (f"{name:<22} median {statistics.median(values):8.3f}{unit}  IQR {q[0]:.3f}-{q[2]:.3f}  "
            f"min {min(values):.3f}  max {max(values):.3f}  (n={len(values)})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=7, help="repetitions of each mode (alternating)")
    ap.add_argument("--steps", type=int, default=300, help="training steps per learner")
    ap.add_argument("--cpus", type=float, default=1, help="the manifest's cpus (threads and cpu quota)")
    args = ap.parse_args()
    why = isolation.unavailable()
    if why:
        print(f"no sandbox on this machine: {why}", file=sys.stderr)
        return 2
    kind = isolation.kind().value
    results: dict[str, list[tuple[float, float, float]]] = {kind: [], "none": []}
    root = Path(tempfile.mkdtemp(prefix="tf-bench-sandbox-"))
    os.chmod(root, 0o755)
    try:
        one_run(root, "bench-warmup", True, 10)  # page cache, torch import, the first netns
        for i in range(args.n):
            order = (kind, "none") if i % 2 == 0 else ("none", kind)
            for mode in order:
                results[mode].append(one_run(root, f"bench-{mode}-{i}", mode == kind, args.steps, args.cpus))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}"
          f", {args.n} alternating runs per mode, {args.steps} training steps, cpus {args.cpus:g}")
    for mode in ("none", kind):
        lat, train, wall = zip(*results[mode], strict=True)
        print(f"[{mode}]")
        print("  " + summary("start latency", list(lat)))
        print("  " + summary("training", list(train)))
        print("  " + summary("learner wall", list(wall)))
    med = {m: [statistics.median(col) for col in zip(*results[m], strict=True)] for m in results}
    print(f"{kind} - none: start latency {1000 * (med[kind][0] - med['none'][0]):+.0f} ms, "
          f"training {100 * (med[kind][1] / med['none'][1] - 1):+.1f}%, "
          f"learner wall {1000 * (med[kind][2] - med['none'][2]):+.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

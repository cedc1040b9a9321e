"""The example job on a GPU: the torch path a learner with a GPU takes, checked and timed.

Runs examples/mnist/train.py the way the controller runs a one-learner job
(TF_CHECKPOINT_DIR, TF_OUTPUT_DIR, TF_CHECKPOINT_INTERVAL in its environment,
CUDA_VISIBLE_DEVICES naming its GPU, or empty for none) and prints:
- the device each run trained on, its wall time and final test accuracy, on
  the CPU and on the GPU (the baseline in the same run is the CPU);
- whether two uninterrupted GPU runs end with bitwise-equal models;
- a GPU run halted mid-epoch (SIGTERM once a checkpoint past step 0 exists,
  as the platform halts) and resumed on the GPU: the halt's exit status, the
  step it resumed from, and whether its final model equals the uninterrupted
  run's, bit for bit;
- the same halted GPU checkpoint resumed on the CPU (a job halted on a GPU
  host and resumed where no GPU is free): that it finishes, and its accuracy.

Needs only a Python with torch (no platform services); without a GPU it says
so and checks the CPU path alone. Exits 1 when a check fails. Usage:

    python bench/gpu_example.py [--epochs 2] [--train-samples 20000]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mnist" / "train.py"


def import_path(tmp: Path) -> str:
    """PYTHONPATH under which `trainforge_frameworks` imports (a link to frameworks/ when not installed)."""
    probe = subprocess.run([sys.executable, "-c", "import trainforge_frameworks"], capture_output=True, check=False)
    if probe.returncode == 0:
        return os.environ.get("PYTHONPATH", "")
    shim = tmp / "shim"
    shim.mkdir(exist_ok=True)
    link = shim / "trainforge_frameworks"
    if not link.exists():
        link.symlink_to(ROOT / "frameworks")
    return str(shim)


class Run:
    """One learner of the example in its own working directory (reused by a resume)."""

    def __init__(self, work: Path, gpu: bool, args: argparse.Namespace, pythonpath: str):
        self.work, self.args = work, args
        work.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1",
                    "TF_CHECKPOINT_DIR": str(work / "checkpoints"), "TF_OUTPUT_DIR": str(work / "results"),
                    "TF_CHECKPOINT_INTERVAL": "0.2", "CUDA_VISIBLE_DEVICES": "0" if gpu else ""}

    def start(self) -> subprocess.Popen:
        argv = [sys.executable, str(EXAMPLE), "--epochs", str(self.args.epochs),
                "--train-samples", str(self.args.train_samples), "--seed", "3"]
        self.log = (self.work / "log.txt").open("a")
        return subprocess.Popen(argv, cwd=self.work, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)

    def finish(self) -> tuple[int, float]:
        t0 = time.monotonic()
        proc = self.start()
        rc = proc.wait(timeout=1800)
        return rc, time.monotonic() - t0

    def halt_mid_run(self) -> tuple[int, int | None]:
        """Start, SIGTERM once a checkpoint past step 0 exists; (exit status, the step it halted at)."""
        meta = self.work / "checkpoints" / "checkpoint.json"
        proc = self.start()
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            if meta.exists() and '"step": 0' not in meta.read_text():
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.005)
        rc = proc.wait(timeout=600)
        return rc, self.halted_at()

    def halted_at(self) -> int | None:
        for line in self.text().splitlines():
            if "halt requested; checkpoint saved at step" in line:
                return int(line.rsplit(" ", 1)[1])
        return None

    def text(self) -> str:
        return (self.work / "log.txt").read_text()

    def accuracy(self) -> str:
        lines = [ln for ln in self.text().splitlines() if ln.startswith("final test accuracy")]
        return lines[-1].split(": ")[1] if lines else "?"

    def device(self) -> str:
        for line in self.text().splitlines():
            if " on " in line and "generating" in line:
                return line.split(" on ", 1)[1].split(":")[0] + (":0" if "cuda" in line else "")
        return "?"


def same_model(a: Path, b: Path) -> bool:
    import torch

    x = torch.load(a / "results" / "model.pt", map_location="cpu", weights_only=True)
    y = torch.load(b / "results" / "model.pt", map_location="cpu", weights_only=True)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-samples", type=int, default=20000)
    args = ap.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if gpu else "no GPU"
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}, "
          f"{name}; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    failures = []
    with tempfile.TemporaryDirectory(prefix="tf-gpu-") as tmp_name:
        tmp = Path(tmp_name)
        path = import_path(tmp)
        devices = [False, True] if gpu else [False]
        full = {}
        for on_gpu in devices:
            run = Run(tmp / f"full-{on_gpu}", on_gpu, args, path)
            rc, secs = run.finish()
            full[on_gpu] = run
            print(f"uninterrupted on {run.device():7s} exit {rc}  {secs:6.1f} s  test accuracy {run.accuracy()}")
            if rc != 0:
                failures.append(f"the uninterrupted run on {run.device()} exited {rc}:\n{run.text()[-2000:]}")
        main_dev = gpu
        again = Run(tmp / "again", main_dev, args, path)
        rc, secs = again.finish()
        equal = rc == 0 and same_model(full[main_dev].work, again.work)
        print(f"a second uninterrupted run on {again.device()}: {secs:.1f} s, bitwise-equal model: {equal}")
        if not equal:
            failures.append("two uninterrupted runs on the same device ended with different models")

        halted = Run(tmp / "halted", main_dev, args, path)
        rc, step = halted.halt_mid_run()
        print(f"halted on {halted.device()} at step {step} (exit {rc})")
        if rc != 0 or step is None:
            failures.append(f"the halt did not end cleanly mid-run (exit {rc}, step {step}):\n{halted.text()[-2000:]}")
        else:
            rc, secs = halted.finish()
            equal = rc == 0 and same_model(full[main_dev].work, halted.work)
            print(f"resumed on {halted.device()}: exit {rc}, {secs:.1f} s, bitwise-equal to the uninterrupted run: "
                  f"{equal}")
            if not equal:
                failures.append("the halted and resumed run's model differs from the uninterrupted run's")
        if gpu:
            moved = Run(tmp / "moved", True, args, path)
            rc, step = moved.halt_mid_run()
            moved.env["CUDA_VISIBLE_DEVICES"] = ""
            rc2, secs = moved.finish() if rc == 0 and step is not None else (None, 0.0)
            resumed = "resuming from step" in moved.text()
            print(f"halted on the GPU at step {step} (exit {rc}), resumed on the CPU: exit {rc2}, {secs:.1f} s, "
                  f"resumed from its checkpoint: {resumed}, test accuracy {moved.accuracy()}")
            if rc2 != 0 or not resumed:
                failures.append(f"a GPU checkpoint did not resume on the CPU:\n{moved.text()[-2000:]}")
    for failure in failures:
        print(f"FAILED: {failure}")
    print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

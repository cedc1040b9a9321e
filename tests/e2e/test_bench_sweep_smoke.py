"""bench/sweep_overhead.py runs end to end (tiny N): it brings up its own stack, sweeps, and prints its table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sweep_overhead_bench_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "sweep_overhead.py"), "--trials", "3",
                           "--parallel", "2", "--seconds", "0.2", "--ray-python", str(tmp_path / "no-ray")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.startswith("machine: ") and "3 trials of 0.2 s, 2 at once" in out
    for row in ("ideal (trials x s / parallel)", "bare local pool", "trainforge: submit -> completed",
                "trainforge: first deploy -> last done"):
        assert row in out, out
    assert "ray tune: not measured" in out

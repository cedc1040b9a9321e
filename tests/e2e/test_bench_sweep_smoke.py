"""bench/sweep_overhead.py runs end to end (tiny N): it brings up its own stack, sweeps, and prints its table;
its Ray Tune peer runs where the bench venv is (`make bench-venv`; BENCH_VENV)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import toolcache

ROOT = Path(__file__).resolve().parents[2]

# one bench at a time (under `make test`'s workers), with tests/integration/test_bench_smoke.py
pytestmark = pytest.mark.xdist_group("bench")


def test_sweep_overhead_bench_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "sweep_overhead.py"), "--trials", "3",
                           "--parallel", "2", "--seconds", "0.2", "--ray-python", str(tmp_path / "no-ray")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.startswith("machine: ") and "3 trials of 0.2 s, 2 at once" in out
    for row in ("ideal (trials x s / parallel)", "bare local pool", "trainforge prestart 0: submit -> completed",
                "trainforge prestart 1: submit -> completed", "trainforge prestart 1: first deploy -> done"):
        assert row in out, out
    assert "ray tune: not measured" in out
    assert "prestart 1: trial phases" in out and "deploying -> running" in out


def test_gate_trace_bench_smoke():
    # one slot, so every trial but the first is held behind its gate and traced
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gate_trace.py"), "--trials", "3",
                           "--parallel", "1", "--seconds", "0.2"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.startswith("machine: ") and "3 trials of 0.2 s, 1 at once, prestart 1: makespan" in out, out
    # trial 0 takes the free slot; a held trial whose gate opened while it was still queued is deployed ungated
    assert re.search(r"\n[12] of 3 trials were held", out), out
    for row in ("gate open -> user's first line", "user's last line -> STORING stamp",
                "a user's last line -> next gate open"):
        assert row in out, out


def test_the_ray_tune_peer_runs_the_same_trials_when_the_bench_venv_is_there():
    python = toolcache.where("bench-venv") / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no bench venv at {python} (make bench-venv)")
    proc = subprocess.run([str(python), str(ROOT / "bench" / "_tune_peer.py"), "3", "2", "0.2"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["trials"], result["errors"]) == (3, 0)
    assert result["fit"] >= 0.2 and result["startup"] > 0


def test_chain_trace_bench_smoke():
    # one slot: each held trial's predecessor is the trial before it; every hop of the chain is timed
    # TF_BENCH_KEEP: the stack's state folder stays after the run, for the second read below
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "chain_trace.py"), "--trials", "3",
                           "--parallel", "1", "--seconds", "0.2"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "TF_BENCH_KEEP": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.startswith("machine: ") and "3 trials of 0.2 s, 1 at once, prestart 1: makespan" in out, out
    assert re.search(r"\n[12] handovers; medians", out), out
    for hop in ("-> the next gate's compare-and-set (driver)", "-> the held controller's watch fires",
                "last user line -> next first user line (total)"):
        assert hop in out, out
    assert re.search(r"driver passes: [1-9]\d*, median", out), out
    state = re.search(r"; state (\S+)", out).group(1)
    try:
        again = subprocess.run([sys.executable, str(ROOT / "bench" / "chain_trace.py"), "--state", state],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert again.returncode == 0 and "-> the held controller's watch fires" in again.stdout, \
            again.stdout + again.stderr
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_handover_latency_bench_smoke():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "handover_latency.py"), "--trials", "3", "--rounds", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("machine: "), proc.stdout
    for mode in ("hand-over", "pass alone"):
        assert re.search(rf"\n  {mode} +median +\d+\.\d .*n 2\)", proc.stdout), proc.stdout

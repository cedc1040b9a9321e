"""Each bench script runs end to end with a tiny N, so the scripts keep working; no timing is asserted.

Every script starts its own private embedded stack; these check that it ran
(exit 0: every job completed, nothing lost or run twice, no error answers)
and printed its machine line and its comparison against the baseline.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# one bench at a time (under `make test`'s workers): each loads the machine with a stack of its own
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("bench")]

ROOT = Path(__file__).resolve().parents[2]


def bench(script: str, *args: str, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{script} exited {out.returncode}:\n{out.stdout}\n{out.stderr[-3000:]}"
    assert out.stdout.startswith("machine: "), out.stdout
    return out.stdout


def test_submit_latency():
    out = bench("submit_latency.py", "-n", "2")
    assert "submit -> RUNNING" in out and "p50/bare" in out


def test_burst():
    out = bench("burst.py", "-n", "4", "-c", "2", "--store-inserts", "20")
    assert "outcomes: 4 accepted, 0 refused, 0 lost (not completed), 0 run twice" in out
    assert "store ceiling: raw insert_one of a job document" in out and "CPU ms per submit over the submit phase" in out
    assert "submits accepted/s" in out and "starts/s" in out and "admission pass, queue > 0 p50" in out
    assert "reservations written after their pass decided p50" in out
    assert "RSS per running job" in out or "service RSS" in out


def test_job_cpu():
    out = bench("job_cpu.py", "-n", "3", "-c", "2")
    assert "3 completed, 0 not ended" in out
    for role in ("api", "trainer", "lcm", "fork server", "etcd", "total (stack)"):
        assert f"\n{role} " in out, f"no row for {role}:\n{out}"


def test_changed_listing():
    out = bench("changed_listing.py", "-n", "20", "-k", "2", "-r", "1", "--page", "8")
    assert "full listing            22 jobs" in out and "changed since as_of      2 jobs" in out
    assert "ratio full / changed (of the medians)" in out


def test_api_read():
    out = bench("api_read.py", "-c", "2", "-d", "1", "-r", "1")
    assert "ratio real / bare" in out and "non-200: 0" in out


def test_train_overhead():
    out = bench("train_overhead.py", "-r", "1", "--epochs", "1", "--train-samples", "200", "--test-samples", "100",
                timeout=900)
    assert "RUNNING -> COMPLETED / bare" in out and "controller + guard CPU per learner" in out


def test_scale_sim():
    out = bench("scale_sim.py", "--queued", "20", "--running", "5", "--teams", "3", "--window", "1",
                "--seconds", "1")
    assert "outcomes: 0 queued jobs not completed, 0 deployed twice" in out
    assert "submits/s (queued)" in out and "time to drain" in out and "admission pass, queue >=" in out
    assert "trainer  CPU" in out and "ms per job" in out


def test_ffdl_jct():
    out = bench("ffdl_jct.py", "--sizes", "1,2", "--train-samples", "64", "--test-samples", "32", timeout=900)
    assert "K=1 " in out and "K=2 " in out and "mean JCT K=2 / K=1" in out


def test_admission_plan():
    out = bench("admission_plan.py", "--queued", "50", "--running", "10", "--teams", "3")
    assert "queued     50,  0 learners free: after" in out and "(10 dispatched)" in out

"""The embedded stack as a user runs it: `trainforge up`, jobs through the CLI, `trainforge down`.

Every service runs as its own subprocess here, exactly as `make demo` starts
them; the tests talk to the platform only through the `trainforge` CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from tests.servers import wait_for
from trainforge_services.common import isolation

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "trainforge.cli"]


def run_cli(env, *args, timeout=120, check=True):
    proc = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"trainforge {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def cli_json(env, *args, **kw):
    return json.loads(run_cli(env, *args, "--json", **kw).stdout)


def stack_processes(stack_id: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("TF_STACK_ID") == stack_id:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_terminal(env, job_id, timeout):
    def done():
        job = cli_json(env, "status", job_id)
        return job if job["state"] in ("completed", "failed", "cancelled") else None

    return wait_for(done, timeout, f"job {job_id} to finish", interval=1.0)


def test_example_job_runs_to_completed(stack):
    env, state, _ = stack
    job_id = cli_json(env, "submit", "examples/mnist/manifest.yaml")["id"]
    job = wait_terminal(env, job_id, 300)
    assert job["state"] == "completed", job
    assert [ln["state"] for ln in job["learners"]] == ["completed", "completed"]
    walked = [h["to"] for h in job["history"]]
    assert walked == ["pending", "queued", "deploying", "running", "storing", "completed"]
    assert all(h["reason"] and h["actor"] for h in job["history"][1:])
    # the trained model is in the object store
    model = state / "objects" / "jobs" / job_id / "outputs" / "0" / "model.pt"
    assert model.is_file() and model.stat().st_size > 1000
    # every log line is searchable after the job ended, in order per learner
    logs = cli_json(env, "logs", job_id)
    lines = logs["lines"]
    assert any("test accuracy" in ln["line"] for ln in lines)
    for learner in (0, 1):
        seqs = [ln["seq"] for ln in lines if ln["learner"] == learner]
        assert seqs == list(range(1, len(seqs) + 1)) and seqs
    only1 = cli_json(env, "logs", job_id, "--learner", "1")["lines"]
    assert only1 and {ln["learner"] for ln in only1} == {1}


def test_failing_job_reports_exit_code_and_last_lines(stack, tmp_path):
    env, _, _ = stack
    manifest = tmp_path / "fail.yaml"
    manifest.write_text(textwrap.dedent("""
        name: fails
        framework: custom
        learners: 2
        resources: {cpus: 0.5, memory: 512Mi}
        command: python -c "import os,sys; print('about to fail on', os.environ['RANK']); sys.exit(3 if os.environ['RANK']=='1' else 0)"
    """))
    job_id = cli_json(env, "submit", str(manifest))["id"]
    job = wait_terminal(env, job_id, 120)
    assert job["state"] == "failed"
    assert "learner 1" in job["reason"] and "code 3" in job["reason"]
    assert "about to fail on 1" in job["reason"]


def test_cancel_stops_the_learners(stack, tmp_path):
    env, state, stack_id = stack
    manifest = tmp_path / "sleep.yaml"
    manifest.write_text("name: sleeper\nframework: custom\nresources: {cpus: 0.5, memory: 256Mi}\n"
                        "command: python -c \"import time; print('sleeping', flush=True); time.sleep(600)\"\n")
    job_id = cli_json(env, "submit", str(manifest))["id"]
    wait_for(lambda: cli_json(env, "status", job_id)["state"] == "running", 120, "sleeper to run", interval=0.5)
    job = cli_json(env, "cancel", job_id)
    assert job["state"] == "cancelled"

    def learner_gone():
        return not any("time.sleep(600)" in " ".join(p.cmdline()) for p in stack_processes(stack_id)
                       if p.is_running())

    wait_for(learner_gone, 60, "the cancelled learner to exit", interval=0.5)


def test_bad_requests_get_clear_errors(stack, tmp_path):
    env, _, _ = stack
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad_Name\nlearners: 0\nresources: {memory: lots}\n")
    proc = run_cli(env, "submit", str(bad), check=False)
    assert proc.returncode != 0
    for field in ("name", "learners", "resources.memory", "command"):
        assert field in proc.stdout + proc.stderr
    proc = run_cli(env, "status", "j-doesnotexist", check=False)
    assert proc.returncode != 0 and "not found" in (proc.stdout + proc.stderr).lower()


def test_down_leaves_no_process_behind(stack, tmp_path):
    env, state, stack_id = stack
    assert stack_processes(stack_id), "the stack should be running before down"
    # a job still running at down: its learners go, and so do its sandbox's network namespace and cgroups
    manifest = tmp_path / "sleep.yaml"
    manifest.write_text("name: running-at-down\nframework: custom\nresources: {cpus: 0.5, memory: 256Mi}\n"
                        "command: python -c \"import time; time.sleep(600)\"\n")
    job_id = cli_json(env, "submit", str(manifest))["id"]
    wait_for(lambda: cli_json(env, "status", job_id)["state"] == "running", 120, "the job to run", interval=0.5)
    sandboxed = os.geteuid() == 0 and not isolation.unavailable()
    assert isolation.left_behind(job_id) == sandboxed, "a sandboxed job has a network namespace and cgroups"
    run_cli(env, "down", timeout=120)
    wait_for(lambda: not stack_processes(stack_id), 30, "every stack process to exit")
    assert not isolation.left_behind(job_id), "the running job's network namespace or cgroups outlived down"
    # up again is possible after down (the module fixture's final down is then a no-op)
    run_cli(env, "up", timeout=180)
    second_id = json.loads((state / "stack.json").read_text())["stack_id"]
    assert stack_processes(second_id)
    run_cli(env, "down", timeout=120)
    wait_for(lambda: not stack_processes(second_id) and not any((state / "pids").glob("*.pid")), 30,
             "a clean second down")

"""`trainforge up` / `down` with the real services, as subprocesses, the way a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import wait_for
from trainforge import stack

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def cli(env, *args, timeout=200):
    proc = subprocess.run([sys.executable, "-m", "trainforge.cli", *args, "--json"], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, f"trainforge {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


def test_up_is_idempotent_and_down_leaves_nothing(tmp_path):
    state = tmp_path / "tf"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env["TF_STATE_DIR"] = str(state)
    stack_ids: list[str] = []
    try:
        first = cli(env, "up")
        stack_ids.append(first["stack_id"])
        assert [c["name"] for c in first["components"]] == list(stack.COMPONENTS)
        assert {c["status"] for c in first["components"]} == {"started"}
        assert first["key_created"] and first["team"] == "local"
        meta = json.loads((state / "stack.json").read_text())
        assert meta["stack_id"] == first["stack_id"]
        for name in stack.COMPONENTS:
            assert (state / "pids" / f"{name}.pid").is_file() and (state / "logs" / f"{name}.log").is_file()
        cfg = json.loads((state / "config.json").read_text())
        assert cfg["api_url"] == first["api_url"] and cfg["api_key"].startswith("tf_") and cfg["team"] == "local"
        assert oct((state / "config.json").stat().st_mode & 0o777) == "0o600"
        assert cli(env, "status") == []

        again = cli(env, "up")
        assert {c["status"] for c in again["components"]} == {"running"}
        assert not again["key_created"] and again["stack_id"] == first["stack_id"]
        assert [c["pid"] for c in again["components"]] == [c["pid"] for c in first["components"]]

        down = cli(env, "down")
        assert {c["name"]: c["status"] for c in down["components"] if c["name"] in stack.COMPONENTS} == \
            dict.fromkeys(stack.COMPONENTS, "stopped")
        wait_for(lambda: not stack.stack_processes(first["stack_id"]), 30, "every stack process to exit")
        assert not list((state / "pids").glob("*.pid"))

        # a new stack after down keeps the data, so the stored key still works
        second = cli(env, "up")
        stack_ids.append(second["stack_id"])
        assert second["stack_id"] != first["stack_id"] and not second["key_created"]
        assert json.loads((state / "config.json").read_text())["api_key"] == cfg["api_key"]
    finally:
        subprocess.run([sys.executable, "-m", "trainforge.cli", "down"], env=env, capture_output=True, timeout=120,
                       cwd=ROOT, check=False)
    assert not any(stack.stack_processes(s) for s in stack_ids)


@pytest.mark.parametrize("failure", [FileNotFoundError("no such interpreter"),
                                     subprocess.TimeoutExpired(["python"], 120),
                                     subprocess.CompletedProcess([], 1, "", "error: no MongoDB\n"),
                                     subprocess.CompletedProcess([], 0, "not json\n", "")])
def test_a_failing_key_bootstrap_is_a_stack_error(tmp_path, monkeypatch, failure):
    def run(*args, **kwargs):
        if isinstance(failure, BaseException):
            raise failure
        return failure

    monkeypatch.setattr(stack.subprocess, "run", run)
    with pytest.raises(stack.StackError, match="could not create an API key.*services.api.admin bootstrap"):
        stack._ensure_key(tmp_path, "http://127.0.0.1:1", {})
    with pytest.raises(stack.StackError, match="--platform-admin --team ops"):
        stack.bootstrap_admin(tmp_path, "ops")
    assert not (tmp_path / "config.json").exists()

"""`trainforge up` / `down` with the real services, as subprocesses, the way a user runs them.

The CLI runs the launcher (`python -m trainforge_services.devstack`) as a process; these tests go through the CLI
and, for `status` and the first key, the launcher itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import free_port, wait_for
from trainforge_services.common.settings import ApiSettings
from trainforge_services.devstack import launcher
from trainforge_services.devstack.components import NAMES, PORT_NAMES, StackError
from trainforge_services.devstack.procs import stack_processes

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def cli(env, *args, timeout=200):
    proc = subprocess.run([sys.executable, "-m", "trainforge.cli", *args, "--json"], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, f"trainforge {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


def launcher_json(env, command, state, *args):
    proc = subprocess.run([sys.executable, "-m", "trainforge_services.devstack", command, "--state-dir", str(state), *args,
                           "--json"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])["result"]


def test_up_is_idempotent_and_down_leaves_nothing(tmp_path):
    state = tmp_path / "tf"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env["TF_STATE_DIR"] = str(state)
    stack_ids: list[str] = []
    try:
        first = cli(env, "up")
        stack_ids.append(first["stack_id"])
        assert [c["name"] for c in first["components"]] == list(NAMES)
        assert {c["status"] for c in first["components"]} == {"started"}
        assert first["key_created"] and first["team"] == "local"
        meta = json.loads((state / "stack.json").read_text())
        assert meta["stack_id"] == first["stack_id"]
        # the Trainer and the LCM serve /metrics on ports of their own, recorded and reported like the others
        metrics = {c["name"]: c["metrics"] for c in first["components"] if c["metrics"]}
        assert metrics == meta["metrics"] and set(metrics) == {"trainer", "lcm", "api"}
        assert metrics["trainer"] == f"http://127.0.0.1:{meta['ports']['trainer_metrics']}/metrics"
        for name, family in (("trainer", "trainforge_admission_decisions"), ("lcm", "trainforge_lcm_running"),
                             ("api", "trainforge_http_requests")):
            text = httpx.get(metrics[name], timeout=10).text
            assert family in {f.name for f in text_string_to_metric_families(text)}, (name, text[:300])
        for name in NAMES:
            assert (state / "pids" / f"{name}.pid").is_file() and (state / "logs" / f"{name}.log").is_file()
        cfg = json.loads((state / "config.json").read_text())
        assert cfg["api_url"] == first["api_url"] and cfg["api_key"].startswith("tf_") and cfg["team"] == "local"
        assert oct((state / "config.json").stat().st_mode & 0o777) == "0o600"
        assert cli(env, "status") == []
        status = launcher_json(env, "status", state)["components"]
        assert [(c["name"], c["status"], c["pid"]) for c in status] == \
            [(c["name"], "running", c["pid"]) for c in first["components"]]

        again = cli(env, "up")
        assert {c["status"] for c in again["components"]} == {"running"}
        assert not again["key_created"] and again["stack_id"] == first["stack_id"]
        assert [c["pid"] for c in again["components"]] == [c["pid"] for c in first["components"]]

        down = cli(env, "down")
        assert {c["name"]: c["status"] for c in down["components"] if c["name"] in NAMES} == \
            dict.fromkeys(NAMES, "stopped"), "\n".join(f"{c['name']}: {c['detail']}" for c in down["components"])
        wait_for(lambda: not stack_processes(first["stack_id"]), 30, "every stack process to exit")
        assert not list((state / "pids").glob("*.pid"))

        # a new stack after down keeps the data, so the stored key still works
        second = cli(env, "up")
        stack_ids.append(second["stack_id"])
        assert second["stack_id"] != first["stack_id"] and not second["key_created"]
        assert json.loads((state / "config.json").read_text())["api_key"] == cfg["api_key"]
    finally:
        subprocess.run([sys.executable, "-m", "trainforge.cli", "down"], env=env, capture_output=True, timeout=120,
                       cwd=ROOT, check=False)
    assert not any(stack_processes(s) for s in stack_ids)


@pytest.mark.parametrize("failure", [RuntimeError("ServerSelectionTimeoutError: 127.0.0.1:1 refused\nmore"),
                                     ValueError(""), OSError("disk full")])
def test_a_failing_key_bootstrap_is_a_stack_error(tmp_path, monkeypatch, failure):
    def bootstrap_key(*args, **kwargs):
        raise failure

    monkeypatch.setattr(launcher, "bootstrap_key", bootstrap_key)
    monkeypatch.setenv("TF_DEV_MODE", "1")
    settings = ApiSettings(dev_mode=True)
    with pytest.raises(StackError, match="could not create an API key for team local") as err:
        launcher._ensure_key(tmp_path, "http://127.0.0.1:1", settings)
    assert "\n" not in err.value.message
    with pytest.raises(StackError, match="could not create an API key for team ops"):
        launcher.bootstrap_admin(tmp_path, "ops")
    assert not (tmp_path / "config.json").exists()


def test_admin_bootstrap_against_an_unreachable_store_is_one_line(tmp_path):
    """Through the CLI and the launcher process: a stack whose MongoDB is gone gives one clear error."""
    state = tmp_path / "tf"
    state.mkdir()
    ports = {name: free_port() for name in PORT_NAMES}
    (state / "stack.json").write_text(json.dumps({"stack_id": "gone", "ports": ports}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env["TF_STATE_DIR"] = str(state)
    proc = subprocess.run([sys.executable, "-m", "trainforge.cli", "admin", "bootstrap", "--json"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    message = json.loads(proc.stdout)["error"]["message"]
    assert message.startswith("could not create an API key for team platform") and "mongo.sock" in message
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr

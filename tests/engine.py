"""A private Docker engine for the docker backend's tests and bench, from tools/engine/setup.sh's cache.

`start_engine()` runs the setup script (a second when warm), starts dockerd
on a socket of its own with its own exec root and a data root in the engine's
cache folder (the per-user cache, `~/.cache/trainforge/engine/<key>/`, which
the setup script prints), waits until it answers, builds the learner images
once (they stay in the data root between runs, and between clones) and
returns an `Engine` handle; `stop()` stops dockerd by its PID. Anything that
goes wrong raises `EngineUnavailable` with the reason: the tier fails, it
never skips.

Two dockerds on one data root fail with a bare "timeout waiting for
containerd" (its metadata database is locked). So a daemon holds an
exclusive lock on its data root (`<cache>/data.lock` for `data/`) from start
to stop. The cache is shared by every clone on the machine, so it has
`DATA_ROOTS` of them (`data/`, `data-1/`, ...): a run takes the first free
one (each warms its images once); when all are taken it waits for the first
up to `lock_wait` seconds, then fails naming the holder.

Images:
- `trainforge/learner:bookworm`: Debian bookworm (minbase plus the libraries
  the platform's interpreter and torch load), imported from the setup's
  root filesystem. The interpreter and torch are bind-mounted by the backend.
- `trainforge/learner-numpy:bookworm`: that plus numpy on the image's own
  PYTHONPATH, a library the platform's environment does not have.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tests.servers import wait_for
from trainforge_services.common.adapters.docker_engine import Engine

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "tools" / "engine" / "setup.sh"
BASE_IMAGE = "trainforge/learner:bookworm"
NUMPY_IMAGE = "trainforge/learner-numpy:bookworm"
IMAGE_LIBS = "/opt/image-libs"
DATA_ROOTS = 3  # test runs from that many clones at once each get a data root


class EngineUnavailable(RuntimeError):
    """The Docker engine could not be set up or started; the message says why."""


@dataclass
class Daemon:
    url: str
    pid: int
    cache: Path
    engine: Engine
    log: Path
    proc: subprocess.Popen | None = None
    run_dir: Path | None = None  # socket, pid file, exec root
    lock: int | None = None  # fd holding `<cache>/<data root>.lock` while this daemon owns the data root

    def stop(self, timeout: float = 30.0) -> None:
        self.engine.close()
        try:
            self._stop(timeout)
        finally:
            if self.run_dir is not None:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            if self.lock is not None:
                os.close(self.lock)  # releases the data root
                self.lock = None

    def _stop(self, timeout: float) -> None:
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            if self.proc is not None:
                self.proc.wait(timeout)
            else:
                wait_for(lambda: not _alive(self.pid), timeout, "dockerd to stop")
        except (subprocess.TimeoutExpired, TimeoutError):
            os.kill(self.pid, signal.SIGKILL)
            if self.proc is not None:
                self.proc.wait(10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def setup(cache: Path | None = None) -> Path:
    """Run tools/engine/setup.sh; the cache directory. EngineUnavailable with its output when it fails."""
    env = dict(os.environ)
    if cache is not None:
        env["TF_ENGINE_CACHE"] = str(cache)
    done = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise EngineUnavailable(f"tools/engine/setup.sh failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lock_data_root(cache: Path, wait: float) -> tuple[int, str]:
    """An fd holding the exclusive lock on one of the cache's data roots, and that root's name: the first free
    one of DATA_ROOTS, else the first once it is free; EngineUnavailable naming the holder after `wait` s."""
    names = ["data"] + [f"data-{i}" for i in range(1, DATA_ROOTS)]
    for name in names:
        fd = os.open(cache / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        if _try_lock(fd):
            break
        os.close(fd)
    else:
        name = names[0]
        fd = os.open(cache / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            wait_for(functools.partial(_try_lock, fd), wait, "the engine's data root to be free", interval=1.0)
        except TimeoutError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise EngineUnavailable(f"the engine's {DATA_ROOTS} data roots in {cache} are in use by other test runs "
                                    f"({cache / name}: {holder}) and were not freed within {wait:g}s: run fewer "
                                    f"docker tiers at once, or give this run its own with TF_ENGINE_CACHE") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}: {' '.join(sys.argv)[:150]}".encode(), 0)
    return fd, name


def start_engine(cache: Path | None = None, timeout: float = 60.0, lock_wait: float = 120.0) -> Daemon:
    cache = setup(cache)
    lock, name = lock_data_root(cache, lock_wait)
    try:
        return _start(cache, name, timeout, lock)
    except BaseException:
        os.close(lock)
        raise


def _start(cache: Path, name: str, timeout: float, lock: int) -> Daemon:
    run = Path(tempfile.mkdtemp(prefix="tf-dockerd-"))  # short: a unix socket path is at most 107 bytes
    log = cache / ("dockerd.log" if name == "data" else f"dockerd-{name}.log")
    sock, pidfile = run / "docker.sock", run / "dockerd.pid"
    data = cache / name
    data.mkdir(exist_ok=True)
    env = dict(os.environ, PATH=f"{cache / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("DOCKER_HOST", None)
    argv = [str(cache / "bin" / "dockerd"), "--data-root", str(data), "--exec-root", str(run / "exec"),
            "-H", f"unix://{sock}", "--pidfile", str(pidfile), "--iptables=false", "--ip-forward=false",
            "--ip-masq=false", "--bridge=none", "--storage-driver=overlay2",
            "--containerd-namespace", "tf-docker", "--containerd-plugins-namespace", "tf-docker-plugins"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    url = f"unix://{sock}"
    try:
        wait_for(lambda: proc.poll() is not None or (sock.exists() and _pings(url)), timeout, "dockerd to answer")
    except TimeoutError:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(run, ignore_errors=True)
        raise EngineUnavailable(f"dockerd did not answer on {url} within {timeout:g}s; its log "
                                f"({log}):\n{_tail(log)}") from None
    if proc.poll() is not None:
        shutil.rmtree(run, ignore_errors=True)
        raise EngineUnavailable(f"dockerd exited with {proc.returncode}; its log ({log}):\n{_tail(log)}")
    daemon = Daemon(url=url, pid=proc.pid, cache=cache, engine=Engine(url, timeout=300), log=log, proc=proc,
                    run_dir=run)
    try:
        ensure_images(daemon)
        sweep(daemon.engine)
    except Exception as e:
        daemon.stop()
        raise EngineUnavailable(f"the learner images could not be built: {e}") from e
    daemon.lock = lock
    return daemon


def _pings(url: str) -> bool:
    try:
        e = Engine(url, timeout=5)
        try:
            e.ping()
            return True
        finally:
            e.close()
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"(unreadable: {e})"


def ensure_images(daemon: Daemon) -> None:
    engine, cache = daemon.engine, daemon.cache
    if not engine.has_image(BASE_IMAGE):
        engine.import_image(str(cache / "rootfs.tar"), BASE_IMAGE,
                            changes=["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    if not engine.has_image(NUMPY_IMAGE):
        wheel = next(cache.glob("wheels/numpy-*.whl"))
        with tempfile.TemporaryDirectory() as ctx:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(Path(ctx) / "libs")
            (Path(ctx) / "Dockerfile").write_text(
                f"FROM {BASE_IMAGE}\nCOPY libs {IMAGE_LIBS}\nENV PYTHONPATH={IMAGE_LIBS}\n")
            engine.build_image(ctx, NUMPY_IMAGE)


def sweep(engine: Engine) -> None:
    """Remove what a crashed earlier run left: every container and network carrying the platform's labels."""
    engine.remove_containers({"tf.stack": ""})
    engine.remove_networks({"tf.stack": ""})

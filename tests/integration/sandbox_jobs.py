"""Real jobs on the local backend for the sandbox tests: an LCM lifecycle with the real servers around it.

`platform` starts a Trainer (gRPC, the fake of test_monitor_flow) and the
REST API (uvicorn) on loopback ports beside the session's etcd, Mongo-wire
and log-store servers, and gives `run(script)`: a job whose code archive
holds `hostile.py`, run as `python hostile.py` by the local backend, whose
final learner status is returned. A hostile script prints `BLOCKED <what>`
for each attempt that failed and `ESCAPED <what>` for one that worked.

`unprivileged_platform` (root only) is the same with every controller (and the job
monitor) run as uid 65534 (`nobody`), so the learners get the sandbox
without root (`isolation: userns`). Its state directory lies outside the
test's 0700 tmp_path, world-traversable and owned by that uid, and the
controllers run an interpreter that uid can reach (the test process's may
live below a 0700 home, as a pyenv build under /root does): a copy of the
running interpreter and its standard library in a world-readable folder
(its library path made relative), and a venv of it that sees the same
packages (the running venv's .pth files). Run as a user other than root,
`own_userns_platform` is the platform as that user, which gets `userns` too.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engine import BASE_IMAGE, start_engine
from tests.fakes.trainer_memory import InMemoryTrainer
from tests.integration.test_controller_run import pack  # noqa: F401 - the hostile tests pack their code with it
from tests.integration.test_monitor_process import start_trainer
from tests.servers import free_port, serve_app, wait_for
from trainforge_services.api.app import create_app
from trainforge_services.common import isolation
from trainforge_services.common.adapters.objectstore import LocalStore, store_from_settings
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.settings import ApiSettings, LcmSettings
from trainforge_services.common.states import LEARNER_FINAL
from trainforge_services.lcm.backends.base import TeamQuota
from trainforge_services.lcm.backends.docker import DockerBackend
from trainforge_services.lcm.backends.local import LocalBackend
from trainforge_services.lcm.lifecycle import JobDeployment, LifecycleManager


@dataclass
class Platform:
    lifecycle: LifecycleManager
    coordinator: object
    settings: LcmSettings
    trainer_port: int
    api_port: int
    isolation: str = "sandbox"  # what its learners get

    @property
    def state_dir(self) -> Path:
        return Path(self.settings.state_dir).resolve()

    def workdir(self, job: str, rank: int = 0, attempt: int = 1) -> Path:
        return self.state_dir / "work" / job / str(attempt) / f"learner-{rank}"

    def deploy(self, job: str, script: str, *, learners: int = 1, env: dict | None = None,
               team_egress: str | None = None, **resources) -> None:
        store = store_from_settings(self.settings)
        store.put_bytes(f"jobs/{job}/code.tar.gz", pack({"hostile.py": script}))
        manifest = Manifest(name="hostile", framework="custom", learners=learners, command="python hostile.py",
                            env=env or {}, resources={"cpus": 0.5, "memory": "256Mi", **resources})
        quota = None if team_egress is None else TeamQuota(egress=team_egress)  # the team's own egress policy
        self.lifecycle.deploy(JobDeployment(job_id=job, team="team-a", attempt=1, manifest=manifest,
                                            code_uri=f"store://jobs/{job}/code.tar.gz", team_quota=quota))

    def status(self, job: str, rank: int = 0) -> dict | None:
        return self.coordinator.get(self.coordinator.keys.learner_status(job, rank))[0]

    def final(self, job: str, rank: int = 0, timeout: float = 90) -> dict:
        return wait_for(lambda: (d := self.status(job, rank)) and d["state"] in LEARNER_FINAL and d, timeout,
                        f"job {job} learner {rank} to end")

    def run(self, job: str, script: str, **kw) -> dict:
        self.deploy(job, script, **kw)
        return self.final(job)

    def log(self, job: str, rank: int = 0) -> str:
        attempt_dir = self.state_dir / "work" / job / "1"
        return "\n".join(p.read_text(errors="replace") for p in sorted(attempt_dir.glob("*.log*")))


@contextmanager
def _platform(store_settings, coordinator, tmp_path: Path, kind: str = "sandbox", backend=LocalBackend,
              **overrides) -> Iterator[Platform]:
    trainer_port = free_port()
    server, _ = start_trainer(trainer_port)
    app = create_app(ApiSettings(dev_mode=True, retention_interval=0), trainer=InMemoryTrainer(), identity=object(), logs=object(),
                     objects=LocalStore(tmp_path / "api-objects"), audit=object())
    settings = LcmSettings(**{**store_settings.model_dump(), "trainer_address": f"127.0.0.1:{trainer_port}",
                              "python": sys.executable, "local_gpus": 0, "lease_ttl": 5, **overrides})
    lifecycle = LifecycleManager.from_settings(settings, backend(settings, kill_grace=5), coordinator,
                                        start_timeout=60, supervise_interval=1.0)
    with serve_app(app) as url:
        yield Platform(lifecycle, coordinator, settings, trainer_port, int(url.rsplit(":", 1)[1]), kind)
        for job in lifecycle.running_jobs():
            lifecycle.kill(job.job_id)
        for path in (Path(settings.state_dir).resolve() / "lcm" / "local").glob("*.json"):
            lifecycle.kill(json.loads(path.read_text())["job_id"])
        lifecycle.close()
    server.stop(0).wait()


@pytest.fixture
def root_platform(store_settings, coordinator, tmp_path) -> Iterator[Platform]:
    """The platform as the test's own user (root: `isolation: sandbox`)."""
    with _platform(store_settings, coordinator, tmp_path) as p:
        yield p


@pytest.fixture(scope="module")
def engine_daemon():
    """A private Docker engine (tests/engine.py) for the module; it fails with the reason, never skips."""
    d = start_engine()
    yield d
    d.stop()


@pytest.fixture
def docker_platform(store_settings, coordinator, tmp_path, engine_daemon) -> Iterator[Platform]:
    """The platform on the docker backend: each learner's command in a container (`isolation: container`)."""
    with _platform(store_settings, coordinator, tmp_path, kind="container",
                   backend=functools.partial(DockerBackend, engine=engine_daemon.engine),
                   docker_url=engine_daemon.url, docker_image=BASE_IMAGE) as p:
        yield p


@pytest.fixture(params=["sandbox", "userns"])
def platform(request) -> Platform:
    """The platform as root (`sandbox`) or with its controllers as uid 65534 (`userns`), where possible; a test
    module using it imports root_platform, unprivileged_platform and nobody_python too.

    Run by a user other than root (tools/py311/run.sh does), `userns` is the platform as that user, whose
    learners get the sandbox without root, and `sandbox` is root's only."""
    if request.param == "sandbox":
        if os.geteuid() != 0:
            pytest.skip("the sandbox with cgroups needs root; this user's learners get `userns`")
        if isolation.unavailable():
            pytest.skip(f"no sandbox here: {isolation.unavailable()}")
        return request.getfixturevalue("root_platform")
    if os.geteuid() != 0:
        if why := isolation.unavailable():
            pytest.fail(f"run as uid {os.geteuid()}, which should get the sandbox without root: {why}")
        return request.getfixturevalue("own_userns_platform")
    if why := unprivileged_unavailable():
        pytest.skip(why)
    return request.getfixturevalue("unprivileged_platform")


NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"


def unprivileged_unavailable() -> str:
    """Why this test machine cannot run the platform as uid 65534 with the userns sandbox; "" when it can."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("unshare") is None:
        return f"needs root, setpriv and unshare to run controllers as uid {NOBODY}"
    probe = subprocess.run([*AS_NOBODY, "unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork",
                            "--ipc", "--uts", "true"], capture_output=True, timeout=30, check=False, cwd="/")
    return "" if probe.returncode == 0 else f"no unprivileged user namespaces for uid {NOBODY}"


def _copy_interpreter(dest: Path) -> Path:
    """The running interpreter, its shared library and standard library under `dest`, with an absolute library
    path (RUNPATH) in the binary rewritten to `$ORIGIN/../lib`, in place (same length, NUL-padded)."""
    base, exe = Path(sys.base_prefix), Path(os.path.realpath(sys.executable))
    (dest / "bin").mkdir(parents=True)
    data, old = exe.read_bytes(), f"{base}/lib".encode() + b"\0"
    new = b"$ORIGIN/../lib"
    if old in data and len(new) < len(old):
        data = data.replace(old, new.ljust(len(old), b"\0"))
    (dest / "bin" / PY).write_bytes(data)
    (dest / "bin" / PY).chmod(0o755)
    (dest / "lib").mkdir()
    for lib in (base / "lib").glob("libpython*.so*"):
        shutil.copy(lib, dest / "lib" / lib.name, follow_symlinks=False)
    shutil.copytree(base / "lib" / PY, dest / "lib" / PY, symlinks=True,
                    ignore=lambda d, names: [n for n in names if Path(d) == base / "lib" / PY and (
                        n in ("test", "site-packages") or n.startswith("config-"))])
    return dest / "bin" / PY


def _reachable(paths: list[Path]) -> list[tuple[Path, int]]:
    """Give "others" search (x, not read) permission on each folder above `paths` that lacks it, so uid
    65534 can open the running venv and the checkout below a 0700 home or temp folder; the old modes."""
    changed: list[tuple[Path, int]] = []
    for path in paths:
        for folder in [*reversed(path.resolve().parents), path.resolve()]:
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH and folder not in dict(changed):
                changed.append((folder, stat.S_IMODE(mode)))
                folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    return changed


@pytest.fixture(scope="session")
def nobody_python() -> Iterator[Path]:
    """A venv that uid 65534 can run, of a copy of the running interpreter, seeing the running venv's packages
    (the running site-packages is added as a site dir, so its .pth files, the editable install's among them,
    are processed)."""
    root = Path(tempfile.mkdtemp(prefix="tf-nobody-py-", dir="/tmp"))
    os.chmod(root, 0o755)
    site_dirs = list(dict.fromkeys(Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")))
    changed = _reachable([*site_dirs, REPO])
    try:
        python = _copy_interpreter(root / "prefix")
        subprocess.run([str(python), "-m", "venv", "--without-pip", str(root / "venv")], check=True,
                       capture_output=True, timeout=120)
        target = root / "venv" / "lib" / PY / "site-packages"
        (target / "tf-running-venv.pth").write_text(
            "".join(f"import site; site.addsitedir({str(d)!r})\n" for d in site_dirs))
        venv_python = root / "venv" / "bin" / "python"
        probe = subprocess.run([*AS_NOBODY, str(venv_python), "-c", "import trainforge_services.controller.__main__"],
                               capture_output=True, text=True, timeout=120, check=False, cwd="/")
        if probe.returncode != 0:
            pytest.fail(f"uid {NOBODY} cannot import the platform from {venv_python}: {probe.stderr[-2000:]}")
        yield venv_python
    finally:
        for folder, mode in reversed(changed):
            folder.chmod(mode)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def unprivileged_platform(store_settings, coordinator, tmp_path, nobody_python) -> Iterator[Platform]:
    state = Path(tempfile.mkdtemp(prefix="tf-userns-", dir="/var/tmp"))  # not below the learner's private /tmp
    try:
        os.chmod(state, 0o755)
        (state / "objects").mkdir()
        # The LCM (this test, root) writes each attempt's folder and spec; the wrapper hands them to uid 65534.
        wrapper = state / "python-as-nobody"
        wrapper.write_text(f'#!/bin/sh\nchown -R {NOBODY}:{NOBODY} "{state}"\n'
                           f'exec {" ".join(AS_NOBODY)} "{nobody_python}" "$@"\n')
        wrapper.chmod(0o755)
        os.chown(state, NOBODY, NOBODY)
        files = store_settings.objectstore_url.startswith("file:")  # else the S3 store of the egress tests
        with _platform(store_settings, coordinator, tmp_path, kind="userns", state_dir=state, python=str(wrapper),
                       **({"objectstore_url": (state / "objects").as_uri()} if files else {})) as p:
            yield p
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def own_userns_platform(store_settings, coordinator, tmp_path) -> Iterator[Platform]:
    """The platform as the test's own user when that is not root: its learners get `isolation: userns`."""
    state = Path(tempfile.mkdtemp(prefix="tf-userns-", dir="/var/tmp"))  # not below the learner's private /tmp
    try:
        os.chmod(state, 0o755)
        (state / "objects").mkdir()
        files = store_settings.objectstore_url.startswith("file:")  # else the S3 store of the egress tests
        with _platform(store_settings, coordinator, tmp_path, kind="userns", state_dir=state,
                       **({"objectstore_url": (state / "objects").as_uri()} if files else {})) as p:
            yield p
    finally:
        shutil.rmtree(state, ignore_errors=True)


def outcome_lines(doc: dict) -> tuple[list[str], list[str]]:
    """(BLOCKED lines, ESCAPED lines) of a hostile learner's last output."""
    tail = doc.get("tail") or []
    return [ln for ln in tail if ln.startswith("BLOCKED")], [ln for ln in tail if ln.startswith("ESCAPED")]

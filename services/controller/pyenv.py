"""Per-job Python environments: a manifest's `requirements:` as a cached virtual environment.

A job that names requirements runs its learner in a virtual environment
built for exactly that requirement set, on top of the platform's own
interpreter. The environment's own site-packages come first on `sys.path`;
after them a `.pth` file adds the platform's site-packages (so torch, which
a user rarely wants a second copy of, is still found, and so is the
learner-side helper `trainforge_frameworks`, which imports nothing from
`trainforge_services`: installed there, or mapped to frameworks/ by the
editable install's finder that those site-packages hold). A requirement
that asks for another version of something the platform has installs its
own copy, and that copy wins.

Environments are shared: each lives under `<cache>/<digest>/`, the digest
covering the normalised requirements, the platform interpreter and the
helper's location, so two jobs with the same requirements build once. Two
controllers that need the same environment at once are serialised by an
exclusive lock on `<digest>.lock`; the environment counts as built only
once its `.trainforge-ready` marker exists, so one left half-built by a
killed controller is removed and built again. The installer is uv (fast,
and its own download cache keeps rebuilds cheap); its output lines are the
progress the learner's PREPARING status shows, and its last lines are the
message of a failed build.

The installer runs on the host with the platform's file and network access,
for a tenant. So every requirement line is checked first (services/common/
reqlines.py: package names only - no installer option, local path, URL or
variable), and uv runs with `--no-config` in an empty HOME and config folder
of its own (no user or system uv.toml, pip.conf or netrc of the host's), with
only the platform's UV_* index settings and proxies passed through, and with
`--no-build` unless TF_ENV_SOURCE_BUILDS allows source distributions (whose
build code would run on the host with the controller's rights and could print
any file it can read into the installer's output). What a failed build
reports - its last TAIL_LINES lines - is then about the job's own requirement
names, the index's answers and the platform's own paths; credentials in URLs
are masked in it besides.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trainforge_frameworks
from trainforge_services.common import reqlines
from trainforge_services.common.errors import InvalidArgument, RefusedReference, TrainforgeError
from trainforge_services.common.manifest import Manifest

log = logging.getLogger(__name__)

READY = ".trainforge-ready"
REQUIREMENTS_FILE = "trainforge-requirements.txt"
PLATFORM_PTH = "_trainforge_platform.pth"
# How many of the installer's last lines a failed build reports.
TAIL_LINES = 15
# A requirements file larger than this is not a requirements file.
MAX_REQUIREMENTS_BYTES = 1 << 20
# Installer variables passed through to uv (the admin's UV_* index, cache and offline settings, proxies, a
# NETRC file for the index's credentials); nothing else of ours. HOME and the config folders are the build's
# own, empty, and no uv.toml is read (the admin configures uv through UV_* variables).
_PASSED = ("PATH", "LANG", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "HTTP_PROXY", "HTTPS_PROXY",
           "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "NETRC")
_UV_DROPPED = ("UV_CONFIG_FILE", "UV_NO_CONFIG")
_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


class EnvBuildFailed(TrainforgeError):
    """Building the job's environment failed; the message ends with the installer's last lines."""

    code = "env_build_failed"


class BuildStopped(Exception):
    """A stop was requested while the environment was being built."""


@dataclass(frozen=True)
class Requirements:
    """A normalised requirement set and where it came from (for messages)."""

    lines: tuple[str, ...]
    source: str

    def text(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)


def _refused(e: reqlines.RefusedLine) -> RefusedReference:
    return RefusedReference(str(e.refusal), refusals=[e.refusal.audit()],
                            details=[{"field": "requirements", "message": str(e.refusal)}])


def requirements_of(manifest: Manifest, workdir: Path) -> Requirements | None:
    """The manifest's requirement set, reading a requirements file from the (already extracted) code folder.

    InvalidArgument names the field when the file is missing or unreadable; RefusedReference names the file,
    the line and the rule a line breaks (services/common/reqlines.py), for the list form too (a job stored
    before the manifest checked it).
    """
    spec = manifest.requirements
    if spec is None:
        return None
    if isinstance(spec, list):
        try:
            lines = reqlines.list_lines(spec)
        except reqlines.RefusedLine as e:
            raise _refused(e) from None
        # A list has no order that matters: the same set in another order is the same environment.
        return Requirements(tuple(sorted(dict.fromkeys(lines))), "the manifest's requirements")
    path = (workdir / spec).resolve()
    if not path.is_relative_to(workdir.resolve()):
        raise InvalidArgument(f"requirements: {spec} resolves outside the code folder")
    try:
        if path.stat().st_size > MAX_REQUIREMENTS_BYTES:
            raise InvalidArgument(f"requirements: {spec} is larger than {MAX_REQUIREMENTS_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidArgument(f"requirements: {spec} is not in the code folder") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"requirements: cannot read {spec}: {type(e).__name__}") from None
    try:
        return Requirements(reqlines.file_lines(text, spec), spec)
    except reqlines.RefusedLine as e:
        raise _refused(e) from None


def _uv_cache() -> Path:
    """uv's download cache where it would be without our empty HOME: the platform user's own."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "uv"


def installer() -> str:
    """The uv executable: the one installed with the platform, else one on PATH."""
    try:
        from uv import find_uv_bin  # the PyPI package ships the binary

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise EnvBuildFailed("requirements: the installer uv is not installed on this machine "
                                 "(pip install uv)") from None
        return found


def helper_dir() -> Path:
    """The folder of the `trainforge_frameworks` package, which learners import the helper from."""
    return Path(trainforge_frameworks.__file__).resolve().parent


def helper_root() -> Path | None:
    """The folder to put on a learner's path for `import trainforge_frameworks`: the one holding the package
    when it is installed under that name (also outside site-packages); None for an editable install (the
    package is the folder frameworks/, mapped to its name by the finder in the platform's site-packages)."""
    folder = helper_dir()
    return folder.parent if folder.name == "trainforge_frameworks" else None


def platform_site_dirs(python: str) -> list[str]:
    """The site-packages folders of the platform interpreter `python`."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        import site

        return [p for p in site.getsitepackages() if os.path.isdir(p)]
    out = subprocess.run([python, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"],
                         capture_output=True, text=True, timeout=60, check=True)
    return [p for p in json.loads(out.stdout) if os.path.isdir(p)]


class EnvCache:
    """Builds and finds environments under `root`; `ensure()` returns the environment's interpreter."""

    def __init__(self, root: Path, *, python: str = sys.executable, uv: str | None = None,
                 timeout: float = 1800.0, lock_poll: float = 0.5, source_builds: bool = False):
        self.root, self.python, self.timeout, self.lock_poll = Path(root), python, timeout, lock_poll
        self._uv = uv
        self.source_builds = source_builds

    def digest(self, reqs: Requirements) -> str:
        h = hashlib.sha256()
        for part in (os.path.realpath(self.python), str(helper_dir()), reqs.text()):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:24]

    def ensure(self, reqs: Requirements, *, progress: Callable[[str], None] = lambda _: None,
               stop_requested: Callable[[], bool] = lambda: False) -> Path:
        """The environment's `bin/python`, building it first if needed.

        Raises EnvBuildFailed (the installer's last lines), BuildStopped.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        key = self.digest(reqs)
        env_dir = self.root / key
        python = env_dir / "bin" / "python"
        if (env_dir / READY).exists():
            os.utime(env_dir / READY)  # when it was last used, for whoever prunes the cache
            return python
        with open(self.root / f"{key}.lock", "a+b") as lock:
            waited = False
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waited:
                        progress(f"waiting for another learner building the environment for {reqs.source}")
                        waited = True
                    if stop_requested():
                        raise BuildStopped("stopped while waiting for the environment") from None
                    time.sleep(self.lock_poll)
            try:
                if not (env_dir / READY).exists():  # the one we waited for may have built it
                    try:
                        self._build(reqs, env_dir, progress, stop_requested)
                    except BaseException:
                        shutil.rmtree(env_dir, ignore_errors=True)  # the next job starts clean
                        raise
                os.utime(env_dir / READY)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return python

    def _build(self, reqs: Requirements, env_dir: Path, progress: Callable[[str], None],
               stop_requested: Callable[[], bool]) -> None:
        if env_dir.exists():
            log.info("removing the half-built environment %s", env_dir)
            shutil.rmtree(env_dir)
        uv = self._uv or installer()
        n = len(reqs.lines)
        progress(f"building the environment for {reqs.source} ({n} requirement{'s' * (n != 1)})")
        self._run([uv, "venv", "--no-config", "--quiet", "--python", self.python, str(env_dir)],
                  "creating the environment", progress, stop_requested)
        site_packages = self._site_packages(env_dir)
        root = helper_root()
        lines = [str(root)] * (root is not None) + [f"import site; site.addsitedir({d!r})" for d in
                                                    platform_site_dirs(self.python)]
        (site_packages / PLATFORM_PTH).write_text("\n".join(lines) + "\n")
        req_file = env_dir / REQUIREMENTS_FILE
        req_file.write_text(reqs.text())
        if reqs.lines:
            self._run(self.install_argv(uv, env_dir, req_file), f"installing {reqs.source}", progress,
                      stop_requested)
        (env_dir / READY).write_text(json.dumps({"requirements": list(reqs.lines), "source": reqs.source,
                                                 "built_at": time.time()}))
        log.info("built the environment %s for %s", env_dir, reqs.source)

    def install_argv(self, uv: str, env_dir: Path, req_file: Path) -> list[str]:
        """uv's command line for the install: no configuration file of the host's, no source builds unless
        allowed; the requirement file is the platform's copy of lines checked by reqlines."""
        return [uv, "pip", "install", "--no-config", *(() if self.source_builds else ("--no-build",)),
                "--python", str(env_dir / "bin" / "python"), "-r", str(req_file)]

    @staticmethod
    def installer_env(home: Path) -> dict[str, str]:
        """The installer's environment: ours filtered (_PASSED, the index's UV_* settings), an empty HOME."""
        env = {k: v for k, v in os.environ.items()
               if k in _PASSED or (k.startswith("UV_") and k not in _UV_DROPPED)}
        env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_CONFIG_DIRS=str(home / ".config"),
                   NO_COLOR="1", UV_NO_CONFIG="1")
        env.setdefault("UV_CACHE_DIR", str(_uv_cache()))
        return env

    @staticmethod
    def _site_packages(env_dir: Path) -> Path:
        found = sorted(env_dir.glob("lib/python*/site-packages"))
        if not found:
            raise EnvBuildFailed(f"requirements: the new environment {env_dir} has no site-packages folder")
        return found[0]

    def _run(self, argv: list[str], what: str, progress: Callable[[str], None],
             stop_requested: Callable[[], bool]) -> None:
        """Run the installer, its output lines as progress; EnvBuildFailed with its last lines if it fails."""
        with tempfile.TemporaryDirectory(prefix="tf-uv-home-") as home:
            self._run_in(argv, what, progress, stop_requested, self.installer_env(Path(home)))

    def _run_in(self, argv: list[str], what: str, progress: Callable[[str], None],
                stop_requested: Callable[[], bool], env: dict[str, str]) -> None:
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, env=env, cwd=self.root,
                                    start_new_session=True)
        except OSError as e:
            raise EnvBuildFailed(f"requirements: {what} failed: cannot run {argv[0]}: {e.strerror or e}") from None
        # not a Loop: a blocking read of the installer's output until it closes
        reader = threading.Thread(target=self._read, args=(proc.stdout, tail, progress), daemon=True)
        reader.start()
        deadline = time.monotonic() + self.timeout
        while proc.poll() is None:
            try:
                proc.wait(0.2)
            except subprocess.TimeoutExpired:
                pass
            if stop_requested() or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                reader.join(5)
                if stop_requested():
                    raise BuildStopped(f"stopped while {what}")
                raise EnvBuildFailed(f"requirements: {what} took longer than {self.timeout:g}s")
        reader.join(10)
        if proc.returncode != 0:
            lines = "\n".join(tail)
            raise EnvBuildFailed(f"requirements: {what} failed (installer exit code {proc.returncode}):\n{lines}")

    @staticmethod
    def _read(stream, tail: deque[str], progress: Callable[[str], None]) -> None:
        with stream:
            for raw in stream:
                line = _CREDENTIALS.sub("***@", raw.rstrip())
                if line:
                    tail.append(line)
                    log.info("installer: %s", line)
                    progress(line)

"""The learner's filesystem view and identity: what the sandbox's entry is told to build.

Read-only: the system (/usr, /etc, the libraries) and the Python the
learner runs (the interpreter's prefixes and every folder on the
controller's import path). Writable: the learner's own working directory
only, plus a private /tmp and /dev/shm. Never: the state directory (other
jobs, the object store, the databases' files, logs) or the platform's home
with its config.json, even when a Python folder lies above them. The uid
is derived from the job id, so the learners of one job share it and two
jobs almost surely do not; the working directory is handed to it.

Without root (`holder`: the job's user-namespace holder, userns.py) the
view has no /sys (the host's would be the only one: a fresh sysfs cannot
be mounted safely there), the learner keeps the platform's uid outside
(uid 0 of the holder's namespace owns its tmpfs) and there are no cgroups;
the new root is built on `stage`, an empty folder of the platform's.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

# the job's uid is named in common: the docker backend's containers run as it too
from trainforge_services.common.isolation import job_uid as job_uid

from ..linebuf import HOOK_DIR

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
TMP_SIZE = "1g"
SHM_SIZE = "1g"


def _secret_below(path: Path, secrets: list[Path]) -> bool:
    return any(s == path or s.is_relative_to(path) for s in secrets)


def editable_packages() -> list[Path]:
    """Package folders an editable install maps imports to (setuptools' `__editable__` finders), which the
    learner's interpreter imports from (the platform's `trainforge_frameworks` helper, say) though they are on no path."""
    out = []
    for name, module in list(sys.modules.items()):
        mapping = getattr(module, "MAPPING", None) if name.startswith("__editable__") else None
        if isinstance(mapping, dict):
            out += [Path(v) for v in mapping.values() if isinstance(v, str) and os.path.isabs(v)]
    return out


def python_paths(python: str, secrets: list[Path]) -> tuple[list[str], list[tuple[str, str]]]:
    """Read-only folders (none holding a path of `secrets`, none inside its first: the state directory) of the learner's Python, and (real, link) pairs for symlinked ones (a venv link)."""
    wanted = [Path(python).parent.parent, Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)]
    wanted += [Path(p) for p in sys.path if p and os.path.isabs(p)]
    wanted += editable_packages()
    wanted.append(HOOK_DIR)  # first on every learner's PYTHONPATH (services/controller/linebuf.py)
    paths: list[str] = []
    aliases: list[tuple[str, str]] = []
    for p in wanted:
        if not p.exists():
            continue
        real = p.resolve()
        # A per-job environment (manifest `requirements:`) may be cached in the state directory: it holds
        # only installed packages, so it alone of that directory is shown (read-only).
        job_env = p == wanted[0] and (p / "pyvenv.cfg").is_file() and not _secret_below(real, secrets)
        if not job_env and (_secret_below(real, secrets) or _secret_below(p, secrets)
                            or real.is_relative_to(secrets[0])):
            continue  # secrets[0] is the state directory: nothing in it either
        if str(real) not in paths:
            paths.append(str(real))
        if real != p.absolute() and (str(real), str(p.absolute())) not in aliases:
            aliases.append((str(real), str(p.absolute())))
    # A folder inside another one is seen through it: bind only the outermost.
    outer = [p for p in paths if not any(q != p and Path(p).is_relative_to(q) for q in paths)]
    return outer, aliases


def config(*, workdir: Path, secrets: list[Path], python: str, netns: Path | None, cgroup_procs: list[str],
           uid: int, hosts: Path | None = None, holder: int = 0, stage: Path | None = None) -> dict:
    py, aliases = python_paths(python, secrets)
    system = [p for p in SYSTEM if os.path.lexists(p) and not (holder and p == "/sys")]
    return {"readonly": system + [p for p in py if not any(Path(p).is_relative_to(s) for s in system)],
            "aliases": aliases, "devices": [*DEVICES, *sorted(glob.glob("/dev/nvidia*"))],
            "workdir": str(workdir), "uid": uid, "gid": uid, "netns": str(netns or ""), "cgroups": cgroup_procs,
            "tmp_size": TMP_SIZE, "shm_size": SHM_SIZE, "hosts": str(hosts) if hosts else "",
            "holder": holder, "stage": str(stage or "")}


def hand_over(workdir: Path, uid: int) -> None:
    """chown the working directory's tree to the learner's uid, never following a link."""
    os.chown(workdir, uid, uid)
    for top, dirs, files in os.walk(workdir):
        for name in dirs + files:
            os.chown(os.path.join(top, name), uid, uid, follow_symlinks=False)


def write_config(path: Path, cfg: dict) -> None:
    path.write_text(json.dumps(cfg, indent=1))
    os.chmod(path, 0o600)

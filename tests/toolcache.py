"""Where the setup scripts (tools/) keep what they build: the one place the tests and the bench look it up.

Every setup script caches its output in the per-user cache, keyed by version and by a hash of the script
(`${XDG_CACHE_HOME:-~/.cache}/trainforge/<thing>/<key>/`, tools/cache.sh), and prints that folder with
`--where`, honouring its override variable (TF_KUBE_CACHE, TF_KUBE_CLIENTS, TF_ENGINE_CACHE, TF_WRK_CACHE,
BENCH_VENV, ...). `where()` asks the script, so the key is computed in one place only.

    python -m tests.toolcache kube        # prints the folder
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {
    "engine": ROOT / "tools" / "engine" / "setup.sh",  # make engine
    "browser": ROOT / "tools" / "browser" / "setup.sh",  # make browser
    "kube": ROOT / "tools" / "kube" / "build.sh",  # make kube: <folder>/bin/kube-apiserver
    "kube-clients": ROOT / "tools" / "kube" / "clients.sh",  # make kube-clients: <folder>/helm, <folder>/kubectl
    "wrk": ROOT / "tools" / "wrk" / "setup.sh",  # make wrk: <folder>/bin/wrk
    "bench-venv": ROOT / "tools" / "benchvenv" / "setup.sh",  # make bench-venv: <folder>/bin/python
}


def where(thing: str) -> Path:
    """The cache folder of `thing` (a key of SCRIPTS) as its setup script names it, built or not."""
    return _where(thing, _env_key())


def _env_key() -> tuple:
    # the overrides and the cache home change the answer; cached per distinct environment
    return tuple(sorted((k, v) for k, v in os.environ.items()
                        if k.startswith("TF_") or k in ("BENCH_VENV", "XDG_CACHE_HOME", "HOME", "PYTHON")))


@functools.cache
def _where(thing: str, _env: tuple) -> Path:
    done = subprocess.run(["bash", str(SCRIPTS[thing]), "--where"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"{SCRIPTS[thing]} --where failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in SCRIPTS:
        sys.exit(f"usage: python -m tests.toolcache {{{','.join(SCRIPTS)}}}")
    print(where(sys.argv[1]))

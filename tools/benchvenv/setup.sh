#!/usr/bin/env bash
# The bench peers' own venv (Ray Jobs for `bench/submit_latency.py --peer ray`, Ray Tune for
# `bench/sweep_overhead.py`; never the project's .venv), in
# ${XDG_CACHE_HOME:-~/.cache}/trainforge/bench-venv/ray-<version>-py<X.Y>-<hash of this script>/ (BENCH_VENV: that
# folder itself; `setup.sh --where` prints it). A venv cannot be renamed into place (its scripts name their
# interpreter by path), so it is made where it stays, under tools/cache.sh's lock, and counts as complete only
# once its stamp (.stamp-ray-tune, written last) is there: an interrupted run leaves no stamp, and the next
# run installs into it again. Prints the venv's folder; a warm run is a no-op.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
. "$ROOT/tools/cache.sh"
RAY_VERSION=2.60.0
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
PYV="$("$PYTHON" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')"
VENV="${BENCH_VENV:-$(tf_cache_home)/bench-venv/$(tf_key "ray-$RAY_VERSION-$PYV" "${BASH_SOURCE[0]}")}"
STAMP="$VENV/.stamp-ray-tune"

if [ "${1:-}" = --where ]; then echo "$VENV"; exit 0; fi
if [ -f "$STAMP" ]; then echo "$VENV"; exit 0; fi
tf_lock "$VENV"
if [ ! -f "$STAMP" ]; then
  test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip --disable-pip-version-check -q install "ray[default,tune]==$RAY_VERSION"
  touch "$STAMP"
fi
echo "$VENV"

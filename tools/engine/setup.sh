#!/usr/bin/env bash
# Sets up a private Docker engine for the docker backend's tests and bench, cached under .cache/engine/:
#   bin/      dockerd, docker, containerd, runc, docker-init (Debian bookworm's docker.io, containerd, runc,
#             tini, unpacked with `dpkg -x`; nothing is installed on the system)
#   rootfs.tar a Debian bookworm root filesystem (mmdebstrap, minbase + the libraries the platform's
#             interpreter and torch load); tools/engine/images.py imports it as the learner image
#   wheels/   the wheel the "library only in its image" image adds
# Every step is skipped when its output exists, so a warm run takes a second. It fails loudly (non-zero,
# with the reason) when something cannot be had: the tests that need the engine never skip silently.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${TF_ENGINE_CACHE:-$ROOT/.cache/engine}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
mkdir -p "$CACHE/debs" "$CACHE/pkgs" "$CACHE/wheels"
say() { echo "engine setup: $*" >&2; }
die() { echo "engine setup FAILED: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "dockerd needs root (running as uid $(id -u))"
command -v apt-get >/dev/null || die "apt-get is needed to fetch Debian's docker.io, containerd, runc and tini"

apt_ready() { apt-cache policy docker.io 2>/dev/null | grep 'Candidate: [0-9]' >/dev/null; }

# 1. engine binaries
if [ ! -x "$CACHE/bin/dockerd" ]; then
  apt_ready || { say "apt-get update"; apt-get update -qq || die "apt-get update failed"; }
  (cd "$CACHE/debs" && apt-get download -qq docker.io containerd runc tini mmdebstrap) \
    || die "apt-get download docker.io containerd runc tini mmdebstrap failed"
  for deb in "$CACHE"/debs/*.deb; do dpkg -x "$deb" "$CACHE/pkgs"; done
  mkdir -p "$CACHE/bin"
  # docker-init (tini) is what dockerd runs as a container's PID 1 for `init=True`
  for b in dockerd docker docker-init docker-proxy containerd containerd-shim-runc-v2 runc; do
    src=""
    for d in bin sbin; do [ -e "$CACHE/pkgs/usr/$d/$b" ] && src="$CACHE/pkgs/usr/$d/$b"; done
    [ -n "$src" ] || die "$b is missing from the unpacked packages"
    ln -sf "$src" "$CACHE/bin/$b"
  done
  say "engine binaries in $CACHE/bin"
fi

# 2. the learner image's root filesystem: the libraries the platform's interpreter and torch load
if [ ! -s "$CACHE/rootfs.tar" ]; then
  apt_ready || { say "apt-get update"; apt-get update -qq || die "apt-get update failed"; }
  say "building a Debian bookworm root filesystem (mmdebstrap)"
  PATH="$CACHE/pkgs/usr/bin:$PATH" perl "$CACHE/pkgs/usr/bin/mmdebstrap" --quiet --mode=root \
    --variant=minbase --include=libpython3.11-stdlib,libgomp1,procps \
    --dpkgopt='path-exclude=/usr/share/{doc,man,locale}/*' \
    bookworm "$CACHE/rootfs.tmp.tar" http://deb.debian.org/debian \
    || die "mmdebstrap could not build the root filesystem"
  mv "$CACHE/rootfs.tmp.tar" "$CACHE/rootfs.tar"
fi

# 3. a wheel that only one image has (numpy: the issue's "Failed to initialize NumPy" case)
if ! ls "$CACHE"/wheels/numpy-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q --only-binary=:all: --no-deps -d "$CACHE/wheels" "numpy==2.2.6" \
    || die "pip download numpy failed"
fi
echo "$CACHE"

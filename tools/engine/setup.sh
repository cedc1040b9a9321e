#!/usr/bin/env bash
# Sets up a private Docker engine for the docker backend's tests and bench, cached in
# ${XDG_CACHE_HOME:-~/.cache}/trainforge/engine/<debian-codename>-<hash of this script>/ (TF_ENGINE_CACHE: that
# folder itself; `setup.sh --where` prints it; tools/cache.sh says how it is written):
#   bin/      dockerd, docker, containerd, runc, docker-init (Debian's docker.io, containerd, runc, tini,
#             unpacked with `dpkg -x` into pkgs/; nothing is installed on the system)
#   rootfs.tar a Debian bookworm root filesystem (mmdebstrap, minbase + the libraries the platform's
#             interpreter and torch load); tests/engine.py imports it as the learner image
#   wheels/   the wheel the "library only in its image" image adds
# tests/engine.py keeps dockerd's data roots (the learner images) beside them. The hash covers the package
# names, the root filesystem's contents and the numpy version written here, so changing any of them makes a
# new folder. A warm run (the folder is there, in any clone on the machine) takes a moment. It fails loudly
# (non-zero, with the reason) when something cannot be had: the tests that need the engine never skip silently.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
. "$ROOT/tools/cache.sh"
CODENAME="$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")"
CACHE="${TF_ENGINE_CACHE:-$(tf_cache_home)/engine/$(tf_key "$CODENAME" "${BASH_SOURCE[0]}")}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
say() { echo "engine setup: $*" >&2; }
die() { echo "engine setup FAILED: $*" >&2; exit 1; }

if [ "${1:-}" = --where ]; then echo "$CACHE"; exit 0; fi
complete() {
  [ -x "$CACHE/bin/dockerd" ] && [ -s "$CACHE/rootfs.tar" ] && ls "$CACHE"/wheels/numpy-*.whl >/dev/null 2>&1
}
if complete; then echo "$CACHE"; exit 0; fi

[ "$(id -u)" = 0 ] || die "dockerd needs root (running as uid $(id -u))"
command -v apt-get >/dev/null || die "apt-get is needed to fetch Debian's docker.io, containerd, runc and tini"
tf_lock "$CACHE"
if complete; then echo "$CACHE"; exit 0; fi  # another run built it while this one waited
TMP="$CACHE.tmp.$$"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/debs" "$TMP/pkgs" "$TMP/wheels" "$TMP/bin"

apt_ready() { apt-cache policy docker.io 2>/dev/null | grep 'Candidate: [0-9]' >/dev/null; }

# 1. engine binaries
apt_ready || { say "apt-get update"; apt-get update -qq || die "apt-get update failed"; }
# (as root without apt's _apt sandbox user, which cannot write under a home directory's cache)
(cd "$TMP/debs" && apt-get download -qq -o APT::Sandbox::User=root docker.io containerd runc tini mmdebstrap) \
  || die "apt-get download docker.io containerd runc tini mmdebstrap failed"
for deb in "$TMP"/debs/*.deb; do dpkg -x "$deb" "$TMP/pkgs"; done
rm -rf "$TMP/debs"
# docker-init (tini) is what dockerd runs as a container's PID 1 for `init=True`; the links are relative, so
# they hold when the folder is renamed into place
for b in dockerd docker docker-init docker-proxy containerd containerd-shim-runc-v2 runc; do
  src=""
  for d in bin sbin; do [ -e "$TMP/pkgs/usr/$d/$b" ] && src="../pkgs/usr/$d/$b"; done
  [ -n "$src" ] || die "$b is missing from the unpacked packages"
  ln -sf "$src" "$TMP/bin/$b"
done

# 2. the learner image's root filesystem: the libraries the platform's interpreter and torch load
# from the bookworm mirror the system's apt already uses (as tools/kube/build.sh), or TF_DEBIAN_MIRROR
MIRROR="${TF_DEBIAN_MIRROR:-$(apt-get indextargets --format '$(RELEASE) $(REPO_URI)' 2>/dev/null \
  | awk '$1 == "bookworm" {print $2; exit}')}"
[ -n "$MIRROR" ] || die "no bookworm mirror in the system's apt configuration; set TF_DEBIAN_MIRROR"
say "building a Debian bookworm root filesystem (mmdebstrap)"
PATH="$TMP/pkgs/usr/bin:$PATH" perl "$TMP/pkgs/usr/bin/mmdebstrap" --quiet --mode=root \
  --variant=minbase --include=libpython3.11-stdlib,libgomp1,procps \
  --dpkgopt='path-exclude=/usr/share/{doc,man,locale}/*' \
  bookworm "$TMP/rootfs.tar" "$MIRROR" \
  || die "mmdebstrap could not build the root filesystem"

# 3. a wheel that only one image has (numpy: the issue's "Failed to initialize NumPy" case)
"$PY" -m pip download -q --only-binary=:all: --no-deps -d "$TMP/wheels" "numpy==2.2.6" \
  || die "pip download numpy failed"

tf_publish "$TMP" "$CACHE"
say "engine binaries, root filesystem and wheel in $CACHE"
echo "$CACHE"

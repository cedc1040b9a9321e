#!/usr/bin/env bash
# Makes Debian's `wrk` (the HTTP load generator bench/api_read.py prefers) available without installing
# anything system-wide: `apt-get download` fetches the wrk and libluajit .debs into .cache/wrk/debs/,
# `dpkg-deb -x` unpacks them into .cache/wrk/root/, and .cache/wrk/bin/wrk runs the unpacked binary
# with its library path. A second run (or a second machine set up from the same tree) reuses the cached
# .debs. Needs neither root nor network beyond the apt sources. Prints the wrapper's path; fails
# loudly (non-zero, with the reason) when wrk cannot be had. Only the bench uses it (`make wrk`).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${TF_WRK_CACHE:-$ROOT/.cache/wrk}"
say() { echo "wrk setup: $*" >&2; }
die() { echo "wrk setup FAILED: $*" >&2; exit 1; }
WRAPPER="$CACHE/bin/wrk"

# `wrk --version` prints its banner and exits 1
works() { [ -x "$WRAPPER" ] && { "$WRAPPER" --version 2>&1 || true; } | grep -q '^wrk '; }
if works; then
  echo "$WRAPPER"
  exit 0
fi
command -v apt-get >/dev/null || die "apt-get is needed to fetch Debian's wrk"
command -v dpkg-deb >/dev/null || die "dpkg-deb is needed to unpack Debian's wrk"
mkdir -p "$CACHE/debs" "$CACHE/bin"
# wrk links LuaJIT; Debian offers two packages of it (either satisfies wrk's dependency)
fetch() {
  local pkg="$1"
  ls "$CACHE/debs/${pkg}_"*.deb >/dev/null 2>&1 && return 0
  (cd "$CACHE/debs" && apt-get download -qq "$pkg" >/dev/null 2>&1)
}
need_update=0
for pkg in wrk libluajit2-5.1-2; do
  if ! fetch "$pkg"; then need_update=1; fi
done
if [ "$need_update" = 1 ]; then
  say "apt-get update"
  apt-get update -qq >/dev/null 2>&1 || say "apt-get update failed (not root?); trying the package lists as they are"
  fetch wrk || die "apt-get download wrk failed"
  fetch libluajit2-5.1-2 || fetch libluajit-5.1-2 || die "apt-get download of libluajit (wrk's dependency) failed"
fi
rm -rf "$CACHE/root"
for deb in "$CACHE"/debs/*.deb; do
  dpkg-deb -x "$deb" "$CACHE/root" || die "dpkg-deb -x $deb failed"
done
[ -x "$CACHE/root/usr/bin/wrk" ] || die "the wrk package holds no usr/bin/wrk"
LIBDIR="$(dirname "$(find "$CACHE/root" -name 'libluajit-5.1.so.2*' | head -n 1)")"
[ -n "$LIBDIR" ] && [ "$LIBDIR" != . ] || die "no libluajit-5.1.so.2 in the unpacked packages"
cat >"$WRAPPER" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH="$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$CACHE/root/usr/bin/wrk" "\$@"
WRAP
chmod +x "$WRAPPER"
works || die "the unpacked wrk does not start ($WRAPPER --version failed)"
echo "$WRAPPER"

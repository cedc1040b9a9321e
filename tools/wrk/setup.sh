#!/usr/bin/env bash
# Makes Debian's `wrk` (the HTTP load generator bench/api_read.py prefers) available without installing
# anything system-wide, in ${XDG_CACHE_HOME:-~/.cache}/trainforge/wrk/<debian-codename>-<hash of this script>/
# (TF_WRK_CACHE: that folder itself; `setup.sh --where` prints it; tools/cache.sh says how it is written):
# `apt-get download` fetches the wrk and libluajit .debs into debs/, `dpkg-deb -x` unpacks them into root/,
# and bin/wrk runs the unpacked binary with its library path. A second run, in any clone on the machine,
# finds it there. Needs neither root nor network beyond the apt sources. Prints the wrapper's path; fails
# loudly (non-zero, with the reason) when wrk cannot be had. Only the bench uses it (`make wrk`).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
. "$ROOT/tools/cache.sh"
CODENAME="$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")"
CACHE="${TF_WRK_CACHE:-$(tf_cache_home)/wrk/$(tf_key "$CODENAME" "${BASH_SOURCE[0]}")}"
say() { echo "wrk setup: $*" >&2; }
die() { echo "wrk setup FAILED: $*" >&2; exit 1; }
WRAPPER="$CACHE/bin/wrk"

if [ "${1:-}" = --where ]; then echo "$CACHE"; exit 0; fi
# `wrk --version` prints its banner and exits 1
works() { [ -x "$1" ] && { "$1" --version 2>&1 || true; } | grep -q '^wrk '; }
if works "$WRAPPER"; then
  echo "$WRAPPER"
  exit 0
fi
command -v apt-get >/dev/null || die "apt-get is needed to fetch Debian's wrk"
command -v dpkg-deb >/dev/null || die "dpkg-deb is needed to unpack Debian's wrk"
tf_lock "$CACHE"
if works "$WRAPPER"; then echo "$WRAPPER"; exit 0; fi  # another run set it up while this one waited
TMP="$CACHE.tmp.$$"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/debs" "$TMP/bin"
# wrk links LuaJIT; Debian offers two packages of it (either satisfies wrk's dependency)
fetch() {
  local pkg="$1"
  ls "$TMP/debs/${pkg}_"*.deb >/dev/null 2>&1 && return 0
  (cd "$TMP/debs" && apt-get download -qq "$pkg" >/dev/null 2>&1)
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
for deb in "$TMP"/debs/*.deb; do
  dpkg-deb -x "$deb" "$TMP/root" || die "dpkg-deb -x $deb failed"
done
[ -x "$TMP/root/usr/bin/wrk" ] || die "the wrk package holds no usr/bin/wrk"
LIBDIR="$(dirname "$(find "$TMP/root" -name 'libluajit-5.1.so.2*' | head -n 1)")"
[ -n "$LIBDIR" ] && [ "$LIBDIR" != . ] || die "no libluajit-5.1.so.2 in the unpacked packages"
# paths relative to the wrapper: they hold when the folder is renamed into place
cat >"$TMP/bin/wrk" <<WRAP
#!/bin/sh
here="\$(cd "\$(dirname "\$0")/.." && pwd)"
LD_LIBRARY_PATH="\$here/${LIBDIR#"$TMP/"}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/root/usr/bin/wrk" "\$@"
WRAP
chmod +x "$TMP/bin/wrk"
works "$TMP/bin/wrk" || die "the unpacked wrk does not start ($TMP/bin/wrk --version failed)"
tf_publish "$TMP" "$CACHE"
echo "$WRAPPER"

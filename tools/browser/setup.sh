#!/usr/bin/env bash
# Installs the headless browser the dashboard's browser tests drive: Debian's `chromium` package
# (Playwright for Python is pointed at it; Playwright's own browser download cannot work here).
# The .debs are cached in ${XDG_CACHE_HOME:-~/.cache}/trainforge/browser/<debian-codename>-<hash of this script>/
# (TF_BROWSER_CACHE: that folder itself; `setup.sh --where` prints it; tools/cache.sh says how it is written),
# so a second clone, or the same machine after the package was removed, installs them without downloading
# again. Fails loudly (non-zero, with the reason) when the browser cannot be had: the browser tests never skip.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
. "$ROOT/tools/cache.sh"
CODENAME="$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")"
CACHE="${TF_BROWSER_CACHE:-$(tf_cache_home)/browser/$(tf_key "$CODENAME" "${BASH_SOURCE[0]}")}"
say() { echo "browser setup: $*" >&2; }
die() { echo "browser setup FAILED: $*" >&2; exit 1; }

if [ "${1:-}" = --where ]; then echo "$CACHE"; exit 0; fi
found() { command -v chromium >/dev/null 2>&1 && chromium --headless=new --no-sandbox --version >/dev/null 2>&1; }
if found; then
  command -v chromium
  exit 0
fi
[ "$(id -u)" = 0 ] || die "installing Debian's chromium needs root (running as uid $(id -u)); or install it yourself"
command -v apt-get >/dev/null || die "apt-get is needed to install Debian's chromium"
if ls "$CACHE"/*.deb >/dev/null 2>&1; then
  say "installing the cached packages from $CACHE"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$CACHE"/*.deb >/dev/null \
    || say "the cached packages did not install"
fi
if ! found; then
  # the packages apt fetches go to a temporary folder, renamed into place once chromium is installed and starts
  tf_lock "$CACHE"
  TMP="$CACHE.tmp.$$"
  trap 'rm -rf "$TMP"' EXIT
  mkdir -p "$TMP/partial"
  apt-cache policy chromium 2>/dev/null | grep -q 'Candidate: [0-9]' || { say "apt-get update"; apt-get update -qq || die "apt-get update failed"; }
  say "apt-get install chromium"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -o Dir::Cache::archives="$TMP" \
    chromium >/dev/null || die "apt-get install chromium failed"
  found || die "chromium is installed but does not start (chromium --headless=new --version failed)"
  rm -rf "$TMP/partial" "$TMP/lock"
  tf_publish "$TMP" "$CACHE"
fi
found || die "chromium is installed but does not start (chromium --headless=new --version failed)"
command -v chromium

# Sourced by the setup scripts (tools/*/): where their outputs are cached and how a finished build is put there.
#
# Everything lives in the per-user cache, outside any clone, so a fresh clone on a machine that built it once
# is warm:   ${XDG_CACHE_HOME:-$HOME/.cache}/trainforge/<thing>/<key>/
# <key> names what the result depends on (a package version) and ends in a short hash of the setup script
# itself, so a changed script never reuses an older build. Each script prints its folder with `--where`
# (tests/toolcache.py asks it that way) and keeps its TF_*_CACHE override.
#
# A build goes into <key>.tmp.<pid> beside its folder and is renamed into place only when complete, under an
# exclusive lock (<key>.lock) that a second build of the same key waits on: an interrupted build leaves a
# temp folder (removed by the next build), never a folder that looks complete.

tf_cache_home() { echo "${XDG_CACHE_HOME:-$HOME/.cache}/trainforge"; }

# tf_key LABEL FILE...: LABEL-<first 12 hex of the sha256 of the files' contents>
tf_key() {
  local label="$1"; shift
  echo "$label-$(cat "$@" | sha256sum | cut -c1-12)"
}

# tf_lock FINAL: hold an exclusive lock for building FINAL until the calling script exits (fd 9)
tf_lock() {
  mkdir -p "$(dirname "$1")"
  exec 9>"$1.lock"
  if ! flock -n 9; then
    echo "waiting for another build of $1 (lock $1.lock)" >&2
    flock 9
  fi
  rm -rf "$1".tmp.*  # what an interrupted build left (builds of this folder hold the lock)
}

# tf_publish TMP FINAL: rename the finished TMP to FINAL; an incomplete FINAL left from before is replaced
tf_publish() {
  local tmp="$1" final="$2"
  if [ -e "$final" ]; then
    mv -T "$final" "$final.tmp.old.$$"
  fi
  mv -T "$tmp" "$final"
  rm -rf "$final.tmp.old.$$"
}

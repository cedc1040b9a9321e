#!/usr/bin/env bash
# The oldest-Python tier (`make py311`, part of `make test`): Debian's own /usr/bin/python3.11 (3.11.2, the
# oldest Python the README admits: no tarfile filters, which came with 3.11.4), run by a user other than root
# so the learners get the sandbox without root (isolation: userns). As that user, in a copy of this working
# tree it owns, with its own venv made by that interpreter and its own pip cache:
#   1. the archive-safety tests (tests/unit/test_controller_workdir.py: the plain extraction path, the only one
#      without tarfile's filter; the rest of tests/unit passes on 3.11.2 as root, but some of it assumes root),
#   2. the sandbox's hostile tests in their `userns` form (a controller as that user),
#   3. the example job as `make demo` runs it (trainforge up, submit examples/mnist/manifest.yaml --follow),
#      then `make down`.
# Needs root (it creates the user and installs python3.11-venv when they are missing). Any failure, a missing
# piece included, ends it non-zero with the reason; it never skips (pytest's skips count as failures here).
# PY311 (the interpreter) and TF_PY311_USER (the user) may be set; the user's copy lies in its home, .venv in it
# and ~/.cache/pip kept between runs.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY311=${PY311:-/usr/bin/python3.11}
TIER_USER=${TF_PY311_USER:-tf-py311}

fail() { echo "tools/py311/run.sh: FAILED: $*" >&2; exit 1; }
say() { echo "== py311: $*"; }

[ "$(id -u)" = 0 ] || fail "run it as root: it creates the user $TIER_USER and runs the tier as that user"
started=$SECONDS

if ! "$PY311" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    say "installing python3.11-venv"
    apt-get update -qq || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11-venv >/dev/null \
        || fail "apt-get install python3.11-venv failed"
fi
[ -x "$PY311" ] || fail "$PY311 does not exist (Debian 12's python3.11 package provides it)"
version=$("$PY311" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
"$PY311" -c 'import sys; sys.exit(not ((3, 11, 2) <= sys.version_info < (3, 12)))' \
    || fail "$PY311 is Python $version; this tier is for the oldest Python the README admits (3.11.2)"

if ! id -u "$TIER_USER" >/dev/null 2>&1; then
    say "creating the user $TIER_USER"
    useradd --create-home --shell /bin/bash "$TIER_USER" || fail "useradd $TIER_USER failed"
fi
home=$(getent passwd "$TIER_USER" | cut -d: -f6)
[ -d "$home" ] || fail "the home of $TIER_USER ($home) does not exist"
work=$home/checkout

# The working tree as it is (tracked files and untracked ones git does not ignore), never the root's .venv or
# caches; the copy's .venv is kept (its stamp is newer than the copied lock files unless they changed).
say "copying $REPO to $work"
runuser -u "$TIER_USER" -- mkdir -p "$work"
find "$work" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -r sh -c 'for f; do [ -e "$f" ] || [ -L "$f" ] && printf "%s\0" "$f"; done' sh \
    | tar --null -T - -cf -) | runuser -u "$TIER_USER" -- tar -C "$work" -xf - \
    || fail "copying the working tree to $work failed"

# The user's environment: nothing of root's (no pyenv on PATH); pip's cache in the user's home. Where root's
# pip finds wheels in a local folder (torch's) by its own configuration, the user gets that folder too.
links=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
[ -z "$links" ] || PIP_FIND_LINKS=$links
as_user() {
    runuser -u "$TIER_USER" -- env -i HOME="$home" USER="$TIER_USER" LOGNAME="$TIER_USER" LANG=C.UTF-8 \
        PATH=/usr/local/bin:/usr/bin:/bin PIP_CACHE_DIR="$home/.cache/pip" PIP_DISABLE_PIP_VERSION_CHECK=1 \
        ${PIP_FIND_LINKS:+PIP_FIND_LINKS="$PIP_FIND_LINKS"} ${PIP_DEFAULT_TIMEOUT:+PIP_DEFAULT_TIMEOUT="$PIP_DEFAULT_TIMEOUT"} \
        ${CI:+CI="$CI"} bash -c "cd '$work' && $1"
}

# pytest's summary must show passes and no skip: a skip here hides what this tier is for.
run_pytest() {
    local what=$1; shift
    local log
    log=$(mktemp)
    chmod 644 "$log"
    say "$what"
    if ! as_user ".venv/bin/python -m pytest -q -rs $*" 2>&1 | tee "$log"; then
        rm -f "$log"
        fail "$what: tests failed (Python $version as $TIER_USER)"
    fi
    if tail -n 3 "$log" | grep -qE '[0-9]+ skipped'; then
        rm -f "$log"
        fail "$what: some tests skipped (listed above); this tier runs them all or fails"
    fi
    if ! tail -n 3 "$log" | grep -qE '[0-9]+ passed'; then
        rm -f "$log"
        fail "$what: no test passed"
    fi
    rm -f "$log"
}

say "installing into $work/.venv with $PY311 (Python $version) as $TIER_USER"
as_user "make install PYTHON='$PY311'" || fail "make install with $PY311 failed"
as_user ".venv/bin/python -c 'import sys; assert sys.version_info[:3] == tuple(map(int, \"$version\".split(\".\"))), sys.version'" \
    || fail "$work/.venv is not a venv of $PY311 (remove it to rebuild)"

run_pytest "the archive-safety tests" tests/unit/test_controller_workdir.py
# The hostile tests in their `userns` form: as this user, the platform's own controllers sandbox without root.
# The pids-limit test needs cgroups, hence root: it runs in the main suite only.
run_pytest "the sandbox's hostile tests (userns)" tests/integration/test_sandbox_hostile.py \
    -k "'userns and not pids_limit'"

say "the example job: make demo, then make down"
demo_started=$SECONDS
if ! as_user "make demo PYTHON='$PY311'"; then
    as_user "make down" || true
    fail "make demo (the example job) did not complete with Python $version as $TIER_USER"
fi
as_user "make down" || fail "make down failed after the example job"
say "example job completed in $((SECONDS - demo_started)) s"

say "passed: Python $version as $TIER_USER in $((SECONDS - started)) s"

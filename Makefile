# The two commands: `make demo` and `make test`. Everything installs from the
# lock files in requirements/ into .venv; torch comes from `pip install torch==2.13.0`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
TORCH := torch==2.13.0
STAMP := $(VENV)/.stamp-installed
# The suite mostly waits on the servers it starts, so it runs on more pytest-xdist workers than CI's 2 cores;
# tests/conftest.py keeps the tests of each one-of-a-kind fixture (engine, control plane, browser) on one worker.
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 3
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

.PHONY: demo test check unit integration e2e protos protos-check lock bench clean down engine browser kube kube-clients bench-venv wrk python-version py311

# The oldest Python the project runs on is 3.11.2 (Debian 12's own; tools/py311/run.sh tests it). Older ones
# stop here with the reason; 3.12 and newer go on with a warning (the lock files are resolved for 3.11).
python-version:
	@test -n "$(PYTHON)" || { echo "make: no python3.11 or python3 on PATH; trainforge needs Python 3.11.2 or a later 3.11: set PYTHON=/path/to/python3.11" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; v = sys.version_info; found = "%d.%d.%d" % v[:3]; \
	sys.exit("make: %s is Python %s; trainforge needs Python 3.11.2 or a later 3.11 (README, Requirements): set PYTHON=/path/to/python3.11" % (sys.executable, found)) if v < (3, 11, 2) else None; \
	v >= (3, 12) and print("make: warning: %s is Python %s; trainforge is tested on 3.11 (3.11.2 and 3.11.7) and its lock files are resolved for 3.11" % (sys.executable, found), file=sys.stderr)'

$(STAMP): requirements/runtime.lock requirements/dev.lock pyproject.toml | python-version
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH)
	$(PIP) install -r requirements/runtime.lock -r requirements/dev.lock
	$(PIP) install --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trainforge up
	$(VENV)/bin/trainforge submit examples/mnist/manifest.yaml --follow

down:
	$(VENV)/bin/trainforge down

# The slow setup steps below cache what they build in the per-user cache, not in the clone, keyed by version
# and by a hash of their script: ${XDG_CACHE_HOME:-~/.cache}/trainforge/<thing>/<key>/ (tools/cache.sh), so a
# fresh clone on a machine that built them once is warm. `tools/<thing>/<script> --where` (or
# `python -m tests.toolcache <thing>`) prints the folder; each keeps its override variable.

check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m trainforge_protos.generate --check

# The docker backend's private engine (binaries, learner image root filesystem, a wheel), cached in
# .../trainforge/engine/<debian-codename>-<hash>/ (TF_ENGINE_CACHE elsewhere); a second when warm. Its tests start
# dockerd themselves and fail (never skip) without it.
engine: $(STAMP)
	PYTHON=$(PY) tools/engine/setup.sh

# Debian's chromium for the dashboard's browser tests (tests/browser/), installed with apt, its .debs cached in
# .../trainforge/browser/<debian-codename>-<hash>/ (TF_BROWSER_CACHE elsewhere); Playwright is pointed at it. The
# browser tests fail (never skip) without it.
browser:
	tools/browser/setup.sh

# kube-apiserver and kube-controller-manager built from Debian's kubernetes source for the real control-plane
# tier (tests/kube.py), cached in .../trainforge/kube/<debian-version>-<hash>/bin/ (TF_KUBE_CACHE for the
# .../trainforge/kube part): 15-25 minutes cold on 2 cores, a no-op when warm. Its tests fail (never skip) without
# them.
kube: $(STAMP)
	PYTHON=$(PY) tools/kube/build.sh

# helm v3.18 and kubectl for the chart's and the kubernetes backend's tests, cached in
# .../trainforge/kube-clients/<package-version>-<hash>/ (TF_KUBE_CLIENTS elsewhere).
kube-clients: $(STAMP)
	PYTHON=$(PY) tools/kube/clients.sh

test: check engine browser kube kube-clients py311
	$(PYTEST) tests

# The oldest Python the README admits: Debian's own /usr/bin/python3.11 (3.11.2), as the non-root user tf-py311
# (created if missing, so the sandbox without root runs), in a copy of this working tree that user owns: the
# archive-safety and unit tests, the sandbox's hostile tests and the example job (`make demo`, then down).
# Needs root; fails, never skips. Minutes; the venv and pip cache are that user's, so a second run is faster.
py311:
	tools/py311/run.sh

unit: $(STAMP)
	$(PYTEST) tests/unit

integration: $(STAMP) engine kube kube-clients
	$(PYTEST) tests/integration

e2e: $(STAMP)
	$(PYTEST) tests/e2e

protos: $(STAMP)
	$(PY) -m trainforge_protos.generate

# Re-resolve the lock files (needs network access to the package index).
lock: $(STAMP)
	$(PIP) install uv==0.13.9
	$(VENV)/bin/uv pip compile --python-version 3.11 requirements/runtime.in -o requirements/runtime.lock
	cd requirements && ../$(VENV)/bin/uv pip compile --python-version 3.11 dev.in -o dev.lock

bench: $(STAMP) wrk
	$(PY) bench/submit_latency.py
	$(PY) bench/halt_resume.py
	$(PY) bench/checkpoint_upload.py
	$(PY) bench/docker_overhead.py
	$(PY) bench/burst.py
	$(PY) bench/api_read.py
	$(PY) bench/train_overhead.py

# A separate venv for bench peers, never the project's own: Ray Jobs for `bench/submit_latency.py --peer ray`,
# Ray Tune for `bench/sweep_overhead.py`, in .../trainforge/bench-venv/ray-<version>-py<X.Y>-<hash>/
# (tools/benchvenv/setup.sh). Elsewhere: `make bench-venv BENCH_VENV=DIR` and export BENCH_VENV=DIR.
bench-venv: | python-version
	PYTHON=$(PYTHON) tools/benchvenv/setup.sh >/dev/null

# Debian's wrk for bench/api_read.py, unpacked (not installed) into .../trainforge/wrk/<debian-codename>-<hash>/
# (TF_WRK_CACHE elsewhere; export it for the script too): a load generator in C leaves the 2 cores to the servers
# it measures. Not part of `make test`.
wrk:
	tools/wrk/setup.sh >/dev/null

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info

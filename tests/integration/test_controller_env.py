"""Per-job environments (manifest `requirements:`) and the manifest's `timeout:`, through a real controller.

The packages come from the package index through uv; uv's own download
cache keeps a rerun fast, and one environment cache is shared by this
module's tests, so numpy is downloaded at most once per machine.
"""

from __future__ import annotations

import pytest

from tests.integration.test_controller_run import controller_log, launch, pack, status  # noqa: F401 - fixture
from trainforge_services.common.states import LearnerState

pytestmark = pytest.mark.slow

# torch's own check: it warns like this when numpy cannot be imported from the learner's interpreter.
NUMPY_WARNING = "Failed to initialize NumPy"

SCRIPT = """\
import sys
import numpy
import torch
import trainforge_frameworks.torch.helper as helper

print("prefix", sys.prefix)
print("sum", torch.from_numpy(numpy.arange(4)).sum().item())
print("helper", helper.__name__)
"""


@pytest.fixture(scope="module")
def env_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("envs")


def lines_of(logstore, job: str) -> list[str]:
    logstore.refresh()
    return [ln["line"] for ln in logstore.read(job).lines]


def test_requirements_file_builds_an_environment_the_learner_runs_in(launch, coordinator, logstore,  # noqa: F811
                                                                       env_cache):
    code = pack({"train.py": SCRIPT, "requirements.txt": "# what train.py needs\nnumpy\n"})
    run = launch({"command": "python train.py", "requirements": "requirements.txt"}, code=code,
                 env_cache_dir=env_cache)
    assert run.wait(300) == 0, controller_log(run)
    doc = status(coordinator, run)
    lines = lines_of(logstore, run.job)
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, (doc, lines[-15:])
    assert "sum 6" in lines and "helper trainforge_frameworks.torch.helper" in lines, lines
    prefix = next(ln for ln in lines if ln.startswith("prefix "))
    assert prefix.removeprefix("prefix ").startswith(str(env_cache)), prefix
    assert not any(NUMPY_WARNING in ln for ln in lines), lines
    # The installer's story is in the job's log; the environment is cached for the next job.
    assert any("building the environment for requirements.txt" in ln for ln in lines), lines
    assert len([p for p in env_cache.iterdir() if (p / ".trainforge-ready").exists()]) == 1


def test_the_same_requirements_reuse_the_cached_environment(launch, coordinator, logstore, env_cache,  # noqa: F811
                                                             unique):
    # The list form, the same set as the file above: the first job builds it unless the test above did; the
    # second must not build again (the test stands alone, whichever pytest worker runs it).
    first = launch({"command": "python -c 'import numpy'", "requirements": ["numpy"]}, job=f"first-{unique}",
                   env_cache_dir=env_cache)
    assert first.wait(300) == 0, controller_log(first)
    run = launch({"command": "python -c 'import numpy, sys; print(sys.prefix)'", "requirements": ["numpy"]},
                 env_cache_dir=env_cache)
    assert run.wait(300) == 0, controller_log(run)
    assert status(coordinator, run)["state"] == LearnerState.LEARNER_COMPLETED, controller_log(run)
    lines = lines_of(logstore, run.job)
    assert lines[-1].startswith(str(env_cache)), lines
    assert not any("building the environment" in ln for ln in lines), lines


def test_a_failing_install_fails_the_job_with_the_installers_message(launch, coordinator, env_cache):  # noqa: F811
    run = launch({"command": "echo never", "requirements": ["trainforge-no-such-package-x7q==1.0"]},
                 env_cache_dir=env_cache)
    assert run.wait(300) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["message"].startswith("preparing the learner failed: requirements: installing "), doc
    assert "installer exit code" in doc["message"]
    assert "trainforge-no-such-package-x7q" in doc["message"], doc["message"]
    assert "never" not in doc["tail"]
    # Nothing half-built is taken for a built environment.
    assert not [p for p in env_cache.iterdir() if p.is_dir() and not (p / ".trainforge-ready").exists()]


def test_a_learner_running_past_its_timeout_fails(launch, coordinator):  # noqa: F811
    run = launch({"command": "echo started; sleep 60", "timeout": "1s"}, kill_grace=1)
    assert run.wait(60) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["message"].startswith("ran longer than 1s (the manifest's timeout)"), doc["message"]
    assert doc["timed_out"] is True  # what tells the Trainer not to restart it


HOST_SECRET = "root:x:0:0:host-only-secret"


def test_a_requirements_file_that_reaches_the_host_fails_before_any_build(launch, coordinator, logstore,  # noqa: F811
                                                                          env_cache, tmp_path):
    # A job stored before the API checked its file (or whose file the API could not read): the controller
    # refuses the line itself, naming the file, the line and the rule, and the installer never runs.
    host = tmp_path / "host-config.json"
    host.write_text(HOST_SECRET + "\n")
    reqs = f"numpy\n-r {host}\n-c {host}\n-e file://{tmp_path}\n--find-links {tmp_path}\n"
    run = launch({"command": "echo never", "requirements": "requirements.txt"},
                 code=pack({"requirements.txt": reqs}), env_cache_dir=env_cache)
    assert run.wait(120) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["message"].startswith("preparing the learner failed: requirements: requirements.txt, line 2: "
                                     "installer options are not allowed"), doc
    lines = lines_of(logstore, run.job)
    seen = "\n".join([doc["message"], *doc.get("tail", []), *lines, controller_log(run)])
    assert HOST_SECRET not in seen
    assert not any("building the environment" in ln for ln in lines), lines

"""The isolation settings on a real controller, and the guard's promise inside the sandbox.

TF_ISOLATION=none runs the learner as before and says so in its status;
TF_REQUIRE_ISOLATION=true refuses such a learner with the reason; the
default sandboxes it here. A controller killed with SIGKILL still takes its
whole learner with it, even a process that left the learner's session; in
the sandbox no guard runs, its entry keeps that promise.
"""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest

from tests.integration.test_controller_run import controller_log, launch, status  # noqa: F401 - fixture
from tests.servers import wait_for
from trainforge_services.common import isolation
from trainforge_services.common.states import LearnerState
from trainforge_services.controller.learner import GUARD
from trainforge_services.controller.sandbox.box import ENTER

needs_sandbox = pytest.mark.skipif(bool(isolation.unavailable()), reason=f"no sandbox here: {isolation.unavailable()}")


def test_isolation_none_is_said_in_the_status_and_the_log(launch, coordinator):  # noqa: F811
    run = launch({"command": "id -u"}, isolation="none")
    assert run.wait() == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, doc
    assert doc["isolation"] == "none"
    assert doc["tail"] == [str(os.geteuid())]
    archive = [json.loads(line) for line in (run.spec_path.parent / "learner-0-1.log.jsonl").read_text().splitlines()]
    assert {"stream": "system", "line": "isolation: none (TF_ISOLATION=none)"}.items() <= archive[0].items()


def test_an_admin_can_refuse_learners_without_a_sandbox(launch, coordinator):  # noqa: F811
    run = launch({"command": "touch ran"}, isolation="none", require_isolation="true")
    assert run.wait() == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED
    assert doc["exit_code"] is None
    assert doc["message"] == ("this platform refuses learners without a sandbox (TF_REQUIRE_ISOLATION) and "
                              "TF_ISOLATION=none")
    assert doc["isolation"] == "none"
    assert not (run.spec_path.parent / "learner-0" / "ran").exists()


@needs_sandbox
def test_the_default_is_a_sandbox_here_and_its_cgroups_go_with_the_learner(launch, coordinator):  # noqa: F811
    run = launch({"command": "id -u; cat /proc/self/status | grep CapEff; hostname"})
    assert run.wait() == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, doc
    assert doc["isolation"] == "sandbox"
    uid, caps, host = doc["tail"]
    assert int(uid) >= 1_000_000_000 and caps.split() == ["CapEff:", "0000000000000000"] and host == "learner"
    assert not any(p.exists() for p in isolation.job_cgroups(run.job)[0].glob("*-*"))
    isolation.remove_job(run.job)  # the LCM's stop does this for a job it ran
    assert not (isolation.NETNS_DIR / isolation.netns_name(run.job)).exists()


@needs_sandbox
def test_a_controller_killed_takes_everything_in_the_sandbox_with_it(launch, coordinator):  # noqa: F811
    run = launch({"command": "setsid sleep 1000 & sleep 1000"})
    wait_for(lambda: (status(coordinator, run) or {}).get("state") == LearnerState.LEARNER_RUNNING, 30,
             "the learner to run")

    def sleepers() -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter(["cmdline", "status"]):
            try:
                if p.info["cmdline"] == ["sleep", "1000"] and p.environ().get("TF_JOB_ID") == run.job:
                    out.append(p)
            except psutil.Error:
                continue
        return out

    both = wait_for(lambda: len(s := sleepers()) == 2 and s, 20, "both sleeps")
    assert len({os.getsid(p.pid) for p in both}) == 2, "one sleep left the learner's session"
    # no guard interpreter: the sandbox's entry leads the learner's group and watches the lifeline itself
    leader = psutil.Process(next(g for p in both if (g := os.getpgid(p.pid)) != p.pid))  # not the setsid one
    assert str(ENTER) in leader.cmdline() and "--lifeline" in leader.cmdline(), leader.cmdline()
    assert not any(str(GUARD) in " ".join(p.cmdline()) for p in [leader, *leader.children(recursive=True)])
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.wait(10)
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in both), 20,
             "the guard to take the sandbox down")
    isolation.remove_job(run.job)
    assert not any(p.exists() for p in isolation.job_cgroups(run.job))

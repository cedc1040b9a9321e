"""The learner sandbox's decisions and view, without a kernel: policy, uid, what is bound."""

from __future__ import annotations

import sys
from pathlib import Path

from trainforge_services.common import isolation
from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.isolation import Isolation
from trainforge_services.common.states import LearnerState
from trainforge_services.controller.sandbox import decide, view
from trainforge_services.jobmonitor.aggregate import learner_views


def test_auto_sandboxes_where_possible_and_says_why_not_elsewhere():
    assert decide("auto", False, why_not="") == decide("sandbox", False, why_not="")
    assert decide("auto", False, why_not="").isolation is Isolation.SANDBOX
    degraded = decide("auto", False, why_not="no root")
    assert (degraded.isolation, degraded.reason, degraded.refused) == (Isolation.NONE, "no root", "")


def test_sandbox_required_by_setting_or_admin_refuses_to_run_without_one():
    assert decide("sandbox", False, why_not="no root").refused == \
        "TF_ISOLATION=sandbox but no sandbox is possible: no root"
    assert decide("auto", True, why_not="no root").refused == \
        "this platform refuses learners without a sandbox (TF_REQUIRE_ISOLATION) and no root"
    assert decide("none", True, why_not="").refused.endswith("and TF_ISOLATION=none")
    off = decide("none", False, why_not="")
    assert (off.isolation, off.reason, off.refused) == (Isolation.NONE, "TF_ISOLATION=none", "")


def test_the_job_uid_is_unprivileged_and_stable_per_job():
    uid = view.job_uid("job-a")
    assert uid == view.job_uid("job-a") != view.job_uid("job-b")
    assert isolation.UID_BASE <= uid < isolation.UID_BASE + isolation.UID_SPAN < 2**31


def test_no_python_folder_above_or_inside_a_secret_is_bound(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    paths, _ = view.python_paths(sys.executable, [state, Path("/nonexistent-home")])
    assert paths and not any(state.is_relative_to(p) or Path(p).is_relative_to(state) for p in paths)
    # a home that holds the platform's config is never bound, even when the interpreter lives above it
    paths, _ = view.python_paths(sys.executable, [state, Path(sys.base_prefix) / "x"])
    assert str(Path(sys.base_prefix).resolve()) not in paths


def test_the_config_binds_only_the_workdir_writable(tmp_path):
    cfg = view.config(workdir=tmp_path / "w", secrets=[tmp_path], python=sys.executable, netns=Path("/run/netns/x"),
                      cgroup_procs=["/c"], uid=1_000_000_001)
    assert cfg["workdir"] == str(tmp_path / "w")
    assert not any(Path(p).is_relative_to(tmp_path) for p in cfg["readonly"])
    assert (cfg["uid"], cfg["gid"], cfg["cgroups"]) == (1_000_000_001, 1_000_000_001, ["/c"])


def test_the_isolation_reaches_the_monitors_view():
    doc = LearnerStatus(state=LearnerState.LEARNER_RUNNING, attempt=1, isolation="sandbox")
    assert LearnerStatus.parse(doc.value()).isolation == "sandbox"
    [v] = learner_views({0: doc}, {}, 1, 1)
    assert v.isolation == "sandbox"


def test_trainforge_up_says_plainly_what_learners_run_in(monkeypatch):
    from trainforge_services.common import isolation

    assert isolation.describe("none", False).startswith("learners: NOT isolated (isolation: none) - TF_ISOLATION=none")
    assert "a job can read the platform's credentials and files" in isolation.describe("none", False)
    assert isolation.describe("none", False).endswith("set TF_REQUIRE_ISOLATION=true to refuse such jobs")
    assert isolation.describe("none", True).startswith("learners: REFUSED")
    monkeypatch.setattr(isolation, "unavailable", lambda: "")
    assert isolation.describe("auto", False).startswith("learners: sandboxed")
    assert isolation.describe("auto", False).endswith("egress at most: none)")
    assert isolation.describe("auto", False, "store,pypi.internal:443").endswith(
        "egress at most: store,pypi.internal:443)")
    monkeypatch.setattr(isolation, "unavailable", lambda: "no root")
    assert isolation.describe("auto", False).startswith("learners: NOT isolated (isolation: none) - no root")


def test_without_root_the_sandbox_is_the_user_namespace_one(monkeypatch):
    from trainforge_services.common import isolation

    monkeypatch.setattr(isolation.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(isolation, "unavailable", lambda: "")
    import trainforge_services.controller.sandbox.policy as policy

    monkeypatch.setattr(policy, "unavailable", lambda: "")
    assert policy.decide("auto", True).isolation is Isolation.USERNS
    assert policy.decide("sandbox", False).refused == ""
    line = isolation.describe("auto", False, "store")
    assert line.startswith("learners: sandboxed without root (isolation: userns")
    assert "NO cgroup limits" in line and line.endswith("egress at most: store)")
    assert LearnerStatus(state=LearnerState.LEARNER_RUNNING, attempt=1, isolation="userns").isolation == "userns"


def test_the_view_without_root_has_no_sys_no_cgroups_and_names_the_holder(tmp_path):
    cfg = view.config(workdir=tmp_path / "w", secrets=[tmp_path / "state"], python=sys.executable, netns=None,
                      cgroup_procs=[], uid=0, holder=4242, stage=tmp_path / "stage")
    assert "/sys" not in cfg["readonly"] and cfg["cgroups"] == [] and cfg["netns"] == ""
    assert (cfg["holder"], cfg["stage"], cfg["uid"]) == (4242, str(tmp_path / "stage"), 0)

"""How the kubernetes backend reads pods (the cluster's reasons), quantities, and its roots back into plans."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_kube_builders import OPTS, plan_for
from trainforge_frameworks import podwaiter as waiter
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.keys import MONITOR_DONE
from trainforge_services.lcm.backends.kubernetes import entry, pods
from trainforge_services.lcm.backends.kubernetes.backend import plan_from_root
from trainforge_services.lcm.backends.kubernetes.status import pod_state, quantity

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
ROOT = Path(__file__).resolve().parents[2]


def pod(phase: str, *, age: float = 5, **status) -> dict:
    created = (NOW - dt.timedelta(seconds=age)).isoformat().replace("+00:00", "Z")
    return {"metadata": {"name": "p", "creationTimestamp": created},
            "spec": {"containers": [{"resources": {"limits": {"memory": "536870912"}}}]},
            "status": {"phase": phase, **status}}


def waiting(reason: str, message: str = "") -> dict:
    return {"containerStatuses": [{"state": {"waiting": {"reason": reason, "message": message}}}]}


def test_running_and_succeeded_pods():
    assert pod_state(pod("Running"), NOW, 60).alive
    done = pod_state(pod("Succeeded"), NOW, 60)
    assert not done.alive and done.succeeded and done.reason == ""


def test_unschedulable_is_alive_with_the_schedulers_words_until_the_pending_timeout():
    cond = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}
    young = pod_state(pod("Pending", age=10, **cond), NOW, 60)
    assert young.alive and young.reason == "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    old = pod_state(pod("Pending", age=61, **cond), NOW, 60)
    assert not old.alive and old.reason.startswith("Unschedulable: 0/3 nodes") and "after 60s" in old.reason


def test_image_pull_backoff_waits_for_the_timeout_a_bad_image_name_does_not():
    backoff = waiting("ImagePullBackOff", 'Back-off pulling image "team/nope:1"')
    assert pod_state(pod("Pending", age=10, **backoff), NOW, 60) == \
        pod_state(pod("Pending", age=10, **backoff), NOW, 60)
    assert pod_state(pod("Pending", age=10, **backoff), NOW, 60).alive
    late = pod_state(pod("Pending", age=90, **backoff), NOW, 60)
    assert not late.alive and late.reason.startswith('ImagePullBackOff: Back-off pulling image "team/nope:1"')
    bad = pod_state(pod("Pending", **waiting("InvalidImageName", "couldn't parse image reference")), NOW, 60)
    assert not bad.alive and bad.reason == "InvalidImageName: couldn't parse image reference"


def test_oom_evicted_and_exit_codes_are_named():
    oom = {"containerStatuses": [{"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}
    assert pod_state(pod("Failed", **oom), NOW, 60).reason == \
        "OOMKilled: the container went over its memory limit of 536870912 bytes"
    evicted = pod_state(pod("Failed", reason="Evicted", message="The node was low on resource: memory."), NOW, 60)
    assert not evicted.alive and evicted.reason == "Evicted: The node was low on resource: memory."
    err = {"containerStatuses": [{"state": {"terminated": {"reason": "Error", "exitCode": 3}}}]}
    assert pod_state(pod("Failed", **err), NOW, 60).reason == "Error: the container exited with code 3"


@pytest.mark.parametrize(("text", "value"), [("3800m", 3.8), ("16Gi", 16 * 2**30), ("16384Ki", 16 * 2**20),
                                              ("8", 8), ("1k", 1000), ("110", 110), ("0", 0)])
def test_quantities(text, value):
    assert quantity(text) == pytest.approx(value)


def test_a_bad_quantity_is_named():
    with pytest.raises(ValueError, match="'lots' is not a Kubernetes quantity"):
        quantity("lots")


def test_a_root_reads_back_into_the_same_plan_without_secret_values():
    plan = plan_for(learners=3, gpus=1, gpu_type="h100", data=True, checkpoint=True, secret=True)
    root = pods.root_object(plan, OPTS)
    root["metadata"]["uid"] = "u1"
    again = plan_from_root(root)
    assert again.model_dump() == plan.model_dump()
    assert again.secret_env == {} and all(s.secret_env == {} for s in again.learners)
    assert "s3cr3t" not in json.dumps(root)
    assert again.gpu_ids == plan.gpu_ids and again.learners[2].rank == 2
    with pytest.raises(InvalidArgument, match="has no plan.json"):
        plan_from_root({"metadata": {"namespace": "n", "name": "x"}, "data": {}})


def test_the_monitor_entrypoint_exits_0_only_when_the_monitor_delivered(tmp_path):
    plan = plan_for()
    env = {**os.environ, entry.SPEC_ENV: plan.monitor.to_json(),
           entry.ATTEMPT_DIR_ENV: str(tmp_path), "TF_ETCD_ENDPOINTS": "127.0.0.1:1", "TF_LEASE_TTL": "1"}
    # an unusable setting: the monitor exits 2 without a marker, and so does the pod
    env["TF_REPORT_RETRY_SECONDS"] = "-1"
    rc = subprocess.run([sys.executable, "-m", pods.ENTRY_MODULE, "monitor"], env=env, timeout=60,
                        capture_output=True).returncode
    assert rc == 2
    assert json.loads((tmp_path / "monitor.json").read_text())["job_id"] == plan.job_id
    assert not (tmp_path / MONITOR_DONE).exists()


def test_the_learner_entrypoint_writes_the_spec_with_secrets_and_hands_over_to_the_controller(tmp_path):
    plan = plan_for(secret=True)
    spec = pods.pod_spec_of(plan.learners[0]).model_copy(update={"workdir": tmp_path / "a" / "learner-0"})
    handoff = tmp_path / "handoff"
    handoff.mkdir()
    env = {**os.environ, entry.SPEC_ENV: spec.to_json(), entry.HANDOFF_ENV: str(handoff),
           f"{entry.SECRET_PREFIX}WANDB_KEY": "s3cr3t", "TF_ETCD_ENDPOINTS": "not a host:port:x"}
    proc = subprocess.run([sys.executable, "-m", pods.ENTRY_MODULE, "learner"], env=env, timeout=60,
                          capture_output=True, text=True)
    # the controller itself ran (it refuses the etcd setting, naming it) and found the spec it was given
    assert proc.returncode == 2 and "TF_ETCD_ENDPOINTS" in proc.stderr
    written = tmp_path / "a" / "learner-0.json"
    assert oct(written.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "a").stat().st_mode & 0o777) == "0o750"  # the learner's uid writes only its workdir
    got = json.loads(written.read_text())
    assert got["secret_env"] == {"WANDB_KEY": "s3cr3t"}
    # the learner runs in the other container: the hand-off is the controller's launcher
    assert got["launcher"][:3] == [sys.executable, "-m", entry.HANDOFF_MODULE] and got["launcher"][-1] == str(handoff)
    # the controller ended: a waiter still waiting for its go ends too
    assert (handoff / waiter.CONTROLLER_END).exists()
    env.pop(entry.HANDOFF_ENV)
    proc = subprocess.run([sys.executable, "-m", pods.ENTRY_MODULE, "learner"], env=env, timeout=60,
                          capture_output=True, text=True)
    assert proc.returncode == entry.EXIT_USAGE and "TF_HANDOFF_DIR is not set" in proc.stderr


def test_the_entrypoint_refuses_an_unknown_role_and_a_bad_spec():
    assert entry.main(["sidecar"]) == entry.EXIT_USAGE
    env = {**os.environ, entry.SPEC_ENV: "{"}
    proc = subprocess.run([sys.executable, "-m", pods.ENTRY_MODULE, "learner"], env=env, timeout=60,
                          capture_output=True, text=True)
    assert proc.returncode == entry.EXIT_USAGE and "TF_SPEC is not valid JSON" in proc.stderr

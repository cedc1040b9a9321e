"""End to end on the kubernetes backend: the embedded stack with `TF_BACKEND=kubernetes` against the real
kube-apiserver and kube-controller-manager (tests/kube.py), with the pods run by the TEST NODE
(tests/kubenode/: it binds pending pods and runs each pod's container command as local processes with the
pod's env, reporting pod status through the API; not a kubelet). The example DDP job goes from
`POST /v1/jobs` (through the CLI) to COMPLETED; halt then resume ends with the uninterrupted run's model.

Every pod shares the test node's network (127.0.0.1), so the rendezvous address is 127.0.0.1 and each
attempt's port is hashed into a span (TF_KUBE_MASTER_PORT_SPAN; docs/KUBERNETES.md).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from pathlib import Path

import pytest

from tests.e2e.test_embedded_stack import cli_json, run_cli, wait_terminal
from tests.e2e.test_halt_resume import EPOCHS, assert_bitwise_equal, example, log_text, model_of
from tests.kube import start_node
from tests.servers import wait_for
from tests.tenancy import published_read, refused_probes, two_teams
from trainforge_services.common.adapters.kube import Kube

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "e2e-"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def e2e_node(kube_cluster):
    """One test node for the module's jobs (tests/kube.py's kube_node is per test)."""
    node_name = f"e2e-{secrets.token_hex(3)}"
    node = start_node(kube_cluster, node_name, gpus=4)
    try:
        yield node
    finally:
        node.stop()
        with Kube(str(kube_cluster.kubeconfig)) as admin:
            admin.delete("Node", None, node_name)
        shutil.rmtree(node.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def kube_stack(kube_cluster, e2e_node):
    # not under /tmp: the test node rewrites a mount path (the pods' /tmp emptyDir) wherever it starts a path
    # in a pod's env, and the object store's file:// path is in the pods' env
    state = ROOT / ".cache" / f"kube-e2e-{secrets.token_hex(3)}"
    state.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env.update(TF_STATE_DIR=str(state), PYTHONUNBUFFERED="1", TF_BACKEND="kubernetes",
               TF_KUBE_CONFIG=str(kube_cluster.kubeconfig), TF_KUBE_PYTHON=sys.executable,
               TF_KUBE_WORKDIR=str(state / "pods"), TF_KUBE_MASTER_ADDR="127.0.0.1",
               TF_KUBE_MASTER_PORT="31000", TF_KUBE_MASTER_PORT_SPAN="2000", TF_KUBE_NAMESPACE_PREFIX=PREFIX,
               TF_KUBE_PENDING_TIMEOUT="15")
    kube = Kube(str(kube_cluster.kubeconfig))
    try:
        run_cli(env, "up", timeout=180)
        yield env, state, kube
    finally:
        run_cli(env, "down", timeout=120, check=False)
        kube.close()
        shutil.rmtree(state, ignore_errors=True)


def job_pods(kube: Kube, job_id: str) -> list[dict]:
    return kube.list("Pod", None, f"tf.job={job_id}")


def run_job(env: dict, work: Path, script: str, resources: str) -> tuple[str, dict]:
    """Submit `script` as a one-learner job named after `work` with `resources`; its id and its end."""
    work.mkdir()
    (work / "job.py").write_text(script)
    (work / "manifest.yaml").write_text(f"name: {work.name}\ncode: .\ncommand: python job.py\n"
                                        f"resources: {resources}\n")
    job_id = cli_json(env, "submit", str(work / "manifest.yaml"))["id"]
    return job_id, wait_terminal(env, job_id, 180)


@pytest.fixture(scope="module")
def reference(kube_stack, tmp_path_factory):
    """The example DDP job, uninterrupted, as pods: its final model."""
    env, state, kube = kube_stack
    job_id = cli_json(env, "submit", str(example(tmp_path_factory.mktemp("ref"), "mnist-kube")))["id"]
    pods = wait_for(lambda: len(p := job_pods(kube, job_id)) == 3 and p, 120, "the monitor and two learner pods")
    names = sorted(p["metadata"]["name"] for p in pods)
    assert names == [f"tf-{job_id}-a1-monitor", f"tf-{job_id}-a1-r0", f"tf-{job_id}-a1-r1"]
    assert {p["metadata"]["namespace"] for p in pods} == {f"{PREFIX}local"}
    job = wait_terminal(env, job_id, 500)
    assert job["state"] == "completed", job
    return job_id, model_of(state, job_id)


def test_the_example_ddp_job_completes_on_pods(kube_stack, reference):
    _, _, kube = kube_stack
    job_id, model = reference
    assert model
    # the Trainer's clean-up (KillJob) of a finished job removes the attempt
    wait_for(lambda: not job_pods(kube, job_id) and not kube.list("ConfigMap", None, f"tf.job={job_id}"), 60,
             "the job's pods and root removed")


def test_halt_then_resume_on_pods_ends_with_the_uninterrupted_model(kube_stack, reference, tmp_path):
    env, state, kube = kube_stack
    job_id = cli_json(env, "submit", str(example(tmp_path, "mnist-kube-halted")))["id"]
    wait_for(lambda: f"epoch 1/{EPOCHS}" in log_text(env, job_id), 300, "the first epoch to end", interval=1.0)
    halted = cli_json(env, "halt", job_id, timeout=180)
    assert halted["state"] == "halted", halted
    assert halted["checkpoint_step"] is not None and halted["checkpoint_step"] > 0
    wait_for(lambda: not job_pods(kube, job_id), 60, "the halted attempt's pods gone")
    assert cli_json(env, "resume", job_id)["attempt"] == 2
    wait_for(lambda: any(p["metadata"]["name"] == f"tf-{job_id}-a2-r0" for p in job_pods(kube, job_id)), 120,
             "attempt 2's pods")
    job = wait_terminal(env, job_id, 400)
    assert job["state"] == "completed", job
    assert f"resuming from step {halted['checkpoint_step']}" in log_text(env, job_id)
    assert_bitwise_equal(model_of(state, job_id), reference[1])


def test_a_failing_learner_reaches_the_job_with_its_exit_code_and_last_lines(kube_stack, e2e_node, tmp_path):
    env, _, kube = kube_stack
    # the learner runs in its own container: it finds no credential of the platform's in its env
    job_id, job = run_job(env, tmp_path / "failing", "import os, sys\n"
                          "print('leaked:', sorted(k for k in os.environ if k.startswith(('TF_S3', 'TF_ETCD', "
                          "'TF_SECRET__'))))\nprint('about to fail', flush=True)\nsys.exit(3)\n",
                          "{cpus: 0.5, memory: 512Mi}")
    assert job["state"] == "failed", job
    assert "learner exited with code 3" in job["reason"], job
    assert "about to fail" in job["reason"] and "leaked: []" in job["reason"], job
    # the learner container ended by itself: the node's log (a pod being deleted has no status reported) has the
    # pod's end, or the controller alone still finishing when the LCM deleted the finished attempt's pods
    # (test_kube_backend.py shows the pod's own end where nothing deletes it)
    pod = f"{PREFIX}local/pods/tf-{job_id}-a1-r0"

    def about_pod() -> list[str]:
        return [x.split(" kubenode ", 1)[1] for x in e2e_node.log.read_text().splitlines() if f"pod {pod}" in x]

    wait_for(lambda: any("ended:" in x or "stopping container" in x for x in about_pod()), 60,
             "the node to log the learner pod's end")
    assert about_pod() in ([f"pod {pod} ended: Failed (controller exited 0, learner exited 3)"],
                           [f"pod {pod}: stopping container controller"]), about_pod()


def test_an_unschedulable_learner_fails_the_job_with_the_schedulers_words(kube_stack, tmp_path):
    env, _, kube = kube_stack
    # the test node has GPUs but no `nvidia.com/gpu.product=a100` label: the scheduler cannot place the pod
    job_id, job = run_job(env, tmp_path / "typed", "print('never runs')\n",
                          "{gpus: 1, gpu_type: a100, cpus: 0.5, memory: 256Mi}")
    assert job["state"] == "failed", job
    assert "Unschedulable: 0/1 nodes are available" in job["reason"], job
    assert "(still pending after 15s)" in job["reason"], job
    wait_for(lambda: not job_pods(kube, job_id), 60, "the failed job's pods removed")


def test_another_teams_objects_are_refused_and_a_published_prefix_is_read_on_a_pod(kube_stack, tmp_path):
    env, state, _ = kube_stack
    teams = two_teams(env, tmp_path)
    refused_probes(teams, tmp_path)
    published_read(teams, state, tmp_path)


@pytest.mark.timeout(600)  # the module's stack starts in the first test that runs
def test_trainforge_admin_health_says_the_test_node_does_not_enforce_network_policies(kube_stack):
    """The LCM's canary (started with the backend) ran its pods on the test node, whose pods share 127.0.0.1:
    the probe a default deny covers connected, and the verdict reaches the admin through the Trainer."""
    env, state, _ = kube_stack
    admin = {**env, "TRAINFORGE_API_KEY": cli_json(env, "admin", "bootstrap", "--team", "ops")["key"]}
    seen = []

    def verdict() -> bool:
        seen.append(cli_json(admin, "admin", "health")["cluster"]["network_policy"])
        return seen[-1] == "NOT enforced"

    try:
        wait_for(verdict, 120, "the canary's verdict in `trainforge admin health`", interval=1)
    except TimeoutError:
        lcm_log = (state / "logs" / "lcm.log").read_text()[-3000:]
        raise AssertionError(f"the verdicts seen: {sorted(set(seen))}\n{lcm_log}") from None
    text = run_cli(admin, "admin", "health").stdout
    assert "NetworkPolicy: NOT enforced" in text and "backend: kubernetes" in text, text
    assert "NetworkPolicy: NOT enforced (a pod the default deny covers connected" in (state / "logs" / "lcm.log").read_text()

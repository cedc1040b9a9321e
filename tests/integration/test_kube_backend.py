"""The kubernetes backend against a real kube-apiserver and kube-controller-manager (1.20, `tests/kube.py`'s
session fixture, built by tools/kube/build.sh; the tier FAILS without it, never skips).

What a real control plane shows that the schemas cannot: the namespace, quotas, limits and policies stored
and kept in step; a GPU job over the team's quota refused by the real ResourceQuota admission with the
quota's own words; an attempt's pods, Service and env as stored; the garbage collector removing an attempt
once its root is deleted; an LCM that lost its records adopting its attempts by label; `helm install` of the
chart. There is no scheduler or kubelet in these tests: pods stay Pending (the test node runs them in
test_kube_e2e.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import toolcache
from tests.servers import wait_for
from trainforge_services.common.adapters.kube import Kube
from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.errors import ResourceExhausted
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.settings import LcmSettings
from trainforge_services.common.states import LearnerState
from trainforge_services.lcm.backends.kubernetes import naming
from trainforge_services.lcm.backends.kubernetes.backend import KubernetesBackend
from trainforge_services.lcm.backends.kubernetes.team import TeamQuota
from trainforge_services.lcm.lifecycle import JobDeployment, LifecycleManager

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = toolcache.where("kube-clients")  # make kube-clients
HELM, KUBECTL = CLIENTS / "helm", CLIENTS / "kubectl"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def settings(kube_cluster, tmp_path, unique, etcd_server):
    return LcmSettings(backend="kubernetes", kube_config=str(kube_cluster.kubeconfig), state_dir=tmp_path / "state",
                       kube_namespace_prefix=f"t{unique[:6]}-", etcd_endpoints=etcd_server.address,
                       etcd_prefix=f"/tf-{unique}", kube_python=sys.executable, kube_pythonpath=str(ROOT),
                       kube_workdir=str(tmp_path / "work"), kube_master_addr="127.0.0.1",
                       kube_master_port=30000, kube_master_port_span=2000, s3_access_key="ak", s3_secret_key="sk")


@pytest.fixture
def gpu_node(kube_cluster, unique):
    """A Node object with 8 allocatable GPUs (no kubelet behind it: capacity and quotas only read it)."""
    kube = Kube(str(kube_cluster.kubeconfig))
    name = f"gpu-{unique}"
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "nvidia.com/gpu.product": "a100"}}, "spec": {"unschedulable": False}})
    alloc = {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110"}
    kube.patch_status("Node", None, name, {"status": {"capacity": alloc, "allocatable": alloc, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test",
         "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    yield name
    kube.delete("Node", None, name)
    kube.close()


@pytest.fixture
def backend(settings, monkeypatch, unique):
    monkeypatch.setenv("TF_STACK_ID", f"s{unique}")
    b = KubernetesBackend(settings)
    yield b
    for ns in b.kube.list("Namespace", selector=f"{naming.STACK}=s{unique}"):
        b.kube.delete("Namespace", None, ns["metadata"]["name"])
    b.close()


@pytest.fixture
def lifecycle(backend, coordinator, settings, gpu_node):
    """A lifecycle on the backend; the Node object gives it capacity (no node: no room for any learner)."""
    lc = LifecycleManager(backend, coordinator, settings.state_dir, supervise_interval=3600)
    yield lc
    lc.close()


def job(job_id: str, team: str = "alpha", learners: int = 2, gpus: int = 0, gpu_type: str | None = None,
        attempt: int = 1) -> JobDeployment:
    manifest = Manifest(name=job_id, learners=learners, command="python train.py", env={"KEY": {"secret": "k"}},
                        resources={"gpus": gpus, "gpu_type": gpu_type, "cpus": 0.5, "memory": "256Mi"})
    return JobDeployment(job_id=job_id, team=team, attempt=attempt, manifest=manifest,
                         code_uri=f"store://jobs/{job_id}/code.tar.gz", secret_env={"KEY": "v4lue"})


def wait_quota_counted(kube: Kube, ns: str, name: str) -> dict:
    """The controller manager has counted the quota (admission refuses pods until it has)."""
    return wait_for(lambda: (q := kube.get("ResourceQuota", ns, name)) and (q.get("status") or {}).get("hard")
                    and q, 60, f"quota {ns}/{name} counted")


def test_team_namespace_quota_and_policies_are_created_and_kept_in_step(backend):
    kube = backend.kube
    ns = backend.sync_team("alpha", TeamQuota(gpus=4, cpus=8, memory=16 * 2**30, jobs=2, gpus_by_type={"a100": 2}))
    stored = kube.get("Namespace", None, ns)
    assert stored["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    quota = wait_quota_counted(kube, ns, "tf-quota")
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "4"
    assert quota["status"]["hard"]["requests.cpu"] == "8200m"
    typed = kube.get("ResourceQuota", ns, "tf-gpu-a100")
    assert typed["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == ["tf-gpu-a100"]
    assert kube.get("LimitRange", ns, "tf-limits") is not None
    policies = {p["metadata"]["name"] for p in kube.list("NetworkPolicy", ns)}
    assert {"tf-default-deny", "tf-allow-dns", "tf-allow-platform"} <= policies
    assert kube.get("Secret", ns, "trainforge-platform")["data"]["TF_S3_SECRET_KEY"]
    # an admin lowers the GPUs and drops the type limit: the namespace follows
    backend.sync_team("alpha", TeamQuota(gpus=2, cpus=8, memory=16 * 2**30, jobs=2))
    wait_for(lambda: kube.get("ResourceQuota", ns, "tf-quota")["status"]["hard"]["requests.nvidia.com/gpu"] == "2",
             60, "the lowered quota counted")
    assert kube.get("ResourceQuota", ns, "tf-gpu-a100") is None


def test_an_admins_quota_change_reaches_the_namespace_at_once_through_the_lcm(backend, lifecycle, settings):
    """The Trainer's SyncTeam call (sent when an admin sets a quota), over gRPC to a real LCM on this backend."""
    from trainforge_services.lcm.wiring import serve
    from trainforge_services.trainer.lcm_client import GrpcLcm
    from trainforge_services.trainer.resources import Quota

    token = "kube-test-service-token-" + "0" * 16
    server, port = serve(settings.model_copy(update={"lcm_address": "127.0.0.1:0", "metrics_port": -1,
                                                     "service_token": token}), lifecycle)
    lcm = GrpcLcm(f"127.0.0.1:{port}", authorization=f"Bearer {token}")
    try:
        assert lcm.sync_team("alpha", Quota(gpus=3, cpus=6, memory=8 * 2**30, jobs=1, gpus_by_type={"a100": 1}))
        ns = naming.namespace(backend.opts, "alpha")
        quota = wait_quota_counted(backend.kube, ns, "tf-quota")
        assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "3"
        assert backend.kube.get("ResourceQuota", ns, "tf-gpu-a100")["spec"]["hard"]["requests.nvidia.com/gpu"] == "1"
        # a bad quota is refused naming the field; the namespace keeps what it had
        from trainforge_services.common.errors import InvalidArgument
        with pytest.raises(InvalidArgument, match="quota"):
            lcm.sync_team("alpha", Quota(gpus=-1))
        assert backend.kube.get("ResourceQuota", ns, "tf-quota")["spec"]["hard"]["requests.nvidia.com/gpu"] == "3"
    finally:
        lcm.close()
        server.stop(0).wait()


def test_a_gpu_job_over_the_teams_quota_is_refused_by_the_resourcequota_in_its_words(backend, lifecycle,
                                                                                    gpu_node):
    ns = backend.sync_team("alpha", TeamQuota(gpus=2))
    wait_quota_counted(backend.kube, ns, "tf-quota")
    assert backend.capacity().gpus >= 8
    with pytest.raises(ResourceExhausted) as e:
        lifecycle.deploy(job("j-big", gpus=2, learners=2))
    assert "exceeded quota: tf-quota" in e.value.message
    assert "requested: requests.nvidia.com/gpu=2" in e.value.message
    assert "limited: requests.nvidia.com/gpu=2" in e.value.message
    # nothing of the refused attempt is left
    wait_for(lambda: not backend.kube.list("Pod", ns, naming.job_selector(backend.opts, "j-big")), 30,
             "the refused attempt's pods gone")
    # a typed GPU job over its type's limit (another team: alpha's usage is recounted asynchronously)
    beta = backend.sync_team("beta", TeamQuota(gpus=8, gpus_by_type={"a100": 1}))
    wait_quota_counted(backend.kube, beta, "tf-gpu-a100")
    with pytest.raises(ResourceExhausted, match="exceeded quota: tf-gpu-a100, requested: requests.nvidia.com/gpu=2"):
        lifecycle.deploy(job("j-typed", team="beta", gpus=2, gpu_type="a100", learners=1))


def test_a_deployed_attempt_has_its_pods_service_and_env(backend, lifecycle):
    handles = lifecycle.deploy(job("j-ddp", learners=3))
    assert sorted(str(h) for h in handles) == sorted(
        ["monitor:tf-j-ddp-a1-monitor"] + [f"controller-{r}:tf-j-ddp-a1-r{r}" for r in range(3)])
    ns = naming.namespace(backend.opts, "alpha")
    pods = {p["metadata"]["name"]: p for p in backend.kube.list("Pod", ns, naming.job_selector(backend.opts, "j-ddp"))}
    root = backend.kube.get("ConfigMap", ns, "tf-j-ddp-a1")
    port = backend.site("j-ddp", 1).master_port
    for rank in range(3):
        pod = pods[f"tf-j-ddp-a1-r{rank}"]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}
        assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == \
            (str(rank), "3", "127.0.0.1", str(port))
        assert env["TF_SECRET__KEY"] == {"secretKeyRef": {"name": "tf-j-ddp-a1-env", "key": "KEY"}}
        assert pod["metadata"]["ownerReferences"][0]["uid"] == root["metadata"]["uid"]
        assert pod["metadata"]["labels"][naming.RANK] == str(rank)
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    service = backend.kube.get("Service", ns, "tf-j-ddp-a1")
    assert service["spec"]["clusterIP"] == "None"
    assert backend.kube.get("Secret", ns, "tf-j-ddp-a1-env")["data"]["KEY"] == "djRsdWU="  # base64 of v4lue
    view = lifecycle.view("j-ddp")
    assert view.alive and not view.monitor_done and len(view.processes) == 4


class _JobCredential:
    """An issuer as the lifecycle runs them: the job's own credential for its controllers and its monitor, in
    place of the platform's object-store keys."""

    name = "test"

    def grant(self, plan):
        from trainforge_services.lcm.backends.base import Grant

        return Grant(controller={"TF_JOB_TOKEN": f"ctl-{plan.job_id}"}, monitor={"TF_JOB_TOKEN": f"mon-{plan.job_id}"},
                     withheld=("TF_S3_ACCESS_KEY", "TF_S3_SECRET_KEY"))

    def revoke(self, job_id: str) -> None:
        pass


def test_a_learner_pods_learner_container_holds_no_credential_as_stored_by_the_apiserver(backend, coordinator,
                                                                                           settings, gpu_node):
    from trainforge_services.lcm.lifecycle.credentials import Credentials

    lc = LifecycleManager(backend, coordinator, settings.state_dir, supervise_interval=3600,
                          credentials=Credentials([_JobCredential()]))
    try:
        lc.deploy(job("j-creds", learners=2))
        ns = naming.namespace(backend.opts, "alpha")
        stored = backend.kube.list("Pod", ns, naming.job_selector(backend.opts, "j-creds"))
        secrets = {s["metadata"]["name"]: s for s in backend.kube.list("Secret", ns)}
        learners = [p for p in stored if p["metadata"]["labels"][naming.ROLE] == "learner"]
        assert len(learners) == 2
        for pod in learners:
            spec = pod["spec"]
            assert spec["automountServiceAccountToken"] is False and not spec.get("shareProcessNamespace")
            by_name = {c["name"]: c for c in spec["containers"]}
            learner, controller = by_name[naming.LEARNER_CONTAINER], by_name[naming.CONTROLLER_CONTAINER]
            # the learner: no Secret in env, envFrom or volumes, no credential value, no token
            assert not learner.get("envFrom") and all("valueFrom" not in e for e in learner["env"])
            mounted = {m["name"] for m in learner["volumeMounts"]}
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert all(set(volumes[m]) == {"name", "emptyDir"} for m in mounted)
            assert not any(m["mountPath"].startswith("/var/run/secrets") for m in learner["volumeMounts"])
            text = str(learner)
            for value in ("ctl-j-creds", "v4lue", "TF_S3_", "TF_JOB_TOKEN", "secretKeyRef"):
                assert value not in text
            assert not {e.get("value") for e in learner["env"]} & {"ak", "sk"}  # the LCM's object-store keys
            assert learner["securityContext"].get("runAsUser", spec["securityContext"]["runAsUser"]) != \
                controller["securityContext"]["runAsUser"]
            # the controller: the job's own credential from the attempt's Secret; the platform's keys withheld
            env = {e["name"]: e.get("value", e.get("valueFrom")) for e in controller["env"]}
            assert env["TF_JOB_TOKEN"] == {"secretKeyRef": {"name": "tf-j-creds-a1-creds",
                                                            "key": "controller.TF_JOB_TOKEN"}}
            assert "TF_S3_SECRET_KEY" not in env and "TF_S3_ACCESS_KEY" not in env
        creds = secrets["tf-j-creds-a1-creds"]
        root = backend.kube.get("ConfigMap", ns, "tf-j-creds-a1")
        assert creds["metadata"]["ownerReferences"][0]["uid"] == root["metadata"]["uid"]
        assert sorted(creds["data"]) == ["controller.TF_JOB_TOKEN", "monitor.TF_JOB_TOKEN"]
        monitor = next(p for p in stored if p["metadata"]["labels"][naming.ROLE] == "monitor")
        menv = {e["name"]: e.get("valueFrom") for e in monitor["spec"]["containers"][0]["env"]}
        assert menv["TF_JOB_TOKEN"] == {"secretKeyRef": {"name": "tf-j-creds-a1-creds", "key": "monitor.TF_JOB_TOKEN"}}
        # deleted at stop with the rest of the attempt
        lc.kill("j-creds")
        wait_for(lambda: backend.kube.get("Secret", ns, "tf-j-creds-a1-creds") is None, 60, "the credentials gone")
    finally:
        lc.close()


def test_a_learner_pod_ends_by_itself_when_its_learner_does_and_its_exit_code_and_last_lines_reach_etcd(
        settings, coordinator, osmem_server, kube_node, monkeypatch, unique):
    # no Trainer and no supervision: nothing deletes the attempt, so the pod's own end is what the API shows
    monkeypatch.setenv("TF_STACK_ID", f"s{unique}")
    (settings.state_dir / "objects").mkdir(parents=True)  # the pods' file:// store (the node leaves it as it is)
    b = KubernetesBackend(settings.model_copy(update={"logstore_url": osmem_server.url}))
    lc = LifecycleManager(b, coordinator, settings.state_dir, supervise_interval=3600)
    manifest = Manifest(name="fails", learners=1, resources={"cpus": 0.5, "memory": "512Mi"},
                        command="python -c \"import sys; print('about to fail', flush=True); sys.exit(3)\"")
    try:
        lc.deploy(JobDeployment(job_id="j-ends", team="alpha", attempt=1, manifest=manifest))
        ns = naming.namespace(b.opts, "alpha")
        pod = wait_for(lambda: (p := b.kube.get("Pod", ns, "tf-j-ends-a1-r0"))
                       and p["status"].get("phase") in ("Succeeded", "Failed") and p, 120, "the learner pod to end")
        assert pod["status"]["phase"] == "Failed" and not pod["metadata"].get("deletionTimestamp")
        codes = {c["name"]: c["state"]["terminated"]["exitCode"] for c in pod["status"]["containerStatuses"]}
        assert codes == {"controller": 0, "learner": 3}
        raw, _ = coordinator.get(coordinator.keys.learner_status("j-ends", 0))
        status = LearnerStatus.parse_or_none(raw)
        assert status is not None and status.state == LearnerState.LEARNER_FAILED and status.exit_code == 3
        assert status.message == "learner exited with code 3" and "about to fail" in status.tail
    finally:
        lc.close()
        for ns in b.kube.list("Namespace", selector=f"{naming.STACK}=s{unique}"):
            b.kube.delete("Namespace", None, ns["metadata"]["name"])
        b.close()


def test_deleting_the_root_lets_the_garbage_collector_remove_the_attempt(backend, lifecycle):
    lifecycle.deploy(job("j-gc"))
    ns = naming.namespace(backend.opts, "alpha")
    selector = naming.job_selector(backend.opts, "j-gc")
    assert backend.kube.list("Pod", ns, selector)
    backend.kube.delete("ConfigMap", ns, "tf-j-gc-a1")  # only the root: the rest is the collector's work
    for kind in ("Pod", "Service", "Secret", "NetworkPolicy"):
        wait_for(lambda kind=kind: not backend.kube.list(kind, ns, selector), 60, f"every {kind} collected")


def test_killing_a_job_leaves_nothing(backend, lifecycle):
    lifecycle.deploy(job("j-kill"))
    assert lifecycle.kill("j-kill") == 3
    ns = naming.namespace(backend.opts, "alpha")
    selector = naming.job_selector(backend.opts, "j-kill")
    for kind in ("Pod", "Service", "Secret", "NetworkPolicy", "ConfigMap"):
        wait_for(lambda kind=kind: not backend.kube.list(kind, ns, selector), 60, f"no {kind} left")


def test_an_lcm_that_lost_its_records_adopts_its_attempts_by_label(backend, coordinator, settings, tmp_path,
                                                                  gpu_node):
    first = LifecycleManager(backend, coordinator, settings.state_dir, supervise_interval=3600)
    first.deploy(job("j-adopt", attempt=2))
    first.close()
    # a new LCM with an empty state directory (the chart's emptyDir after a reschedule)
    again = KubernetesBackend(settings)
    second = LifecycleManager(again, coordinator, tmp_path / "fresh-state", supervise_interval=3600)
    try:
        view = second.view("j-adopt")
        assert view is not None and view.alive
        assert sorted(h.name for h in view.handles) == ["controller-0", "controller-1", "monitor"]
        # a resent deploy of the same attempt starts nothing twice
        second.deploy(job("j-adopt", attempt=2))
        assert len(again.kube.list("Pod", None, naming.job_selector(again.opts, "j-adopt"))) == 3
        second.kill("j-adopt")
        wait_for(lambda: not again.kube.list("Pod", None, naming.job_selector(again.opts, "j-adopt")), 60,
                 "the adopted attempt removed")
    finally:
        second.close()


def test_helm_install_of_the_chart_succeeds(kube_cluster, unique):
    assert HELM.exists(), f"{HELM} is missing: run `make kube-clients`"
    ns = f"chart-{unique}"
    base = [str(HELM), "--kubeconfig", str(kube_cluster.kubeconfig), "--namespace", ns]
    # 1.20 has no gRPC probes: the same health check by command
    out = subprocess.run([*base, "install", f"tf{unique[:6]}", str(ROOT / "deploy/helm/trainforge"),
                          "--create-namespace", "--set", "probes.mode=exec", "--wait=false"],
                         capture_output=True, text=True, timeout=180)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        kube = Kube(str(kube_cluster.kubeconfig))
        assert kube.get("Namespace", None, ns) is not None
        deployments = subprocess.run([str(KUBECTL), "--kubeconfig",
                                      str(kube_cluster.kubeconfig), "-n", ns, "get", "deployments,pdb,networkpolicies,"
                                      "services,serviceaccounts", "-o", "name"], capture_output=True, text=True,
                                     timeout=60, check=True).stdout.split()
        assert {f"deployment.apps/tf{unique[:6]}-{c}" for c in ("api", "trainer", "lcm")} <= set(deployments)
        assert sum(d.startswith("poddisruptionbudget") for d in deployments) == 3
        assert sum(d.startswith("networkpolicy") for d in deployments) == 3
        kube.close()
    finally:
        subprocess.run([*base, "uninstall", f"tf{unique[:6]}"], capture_output=True, timeout=120)
        subprocess.run([str(KUBECTL), "--kubeconfig", str(kube_cluster.kubeconfig),
                        "delete", "namespace", ns, "--wait=false"], capture_output=True, timeout=60)


def test_an_elastic_attempt_starts_its_minimum_as_torchrun_pods_and_a_grant_adds_the_next_slot(backend, lifecycle):
    """`learners: {min: 2, max: 3}`: two pods (slots 0 and 1) whose env is torchrun's PET_* (c10d store in
    slot 0, the job's rendezvous endpoint, nodes 2:3), not env://; the Trainer's grant of 3 adds slot 2's pod
    with the same rendezvous on the next supervision pass."""
    manifest = Manifest(name="j-el", learners={"min": 2, "max": 3}, framework="torch", command="python train.py",
                        resources={"cpus": 0.5, "memory": "256Mi"})
    lifecycle.deploy(JobDeployment(job_id="j-el", team="alpha", attempt=1, manifest=manifest,
                                   code_uri="store://jobs/j-el/code.tar.gz"))
    ns = naming.namespace(backend.opts, "alpha")
    selector = naming.job_selector(backend.opts, "j-el")
    port = backend.site("j-el", 1).master_port

    def learner_envs() -> dict[int, dict]:
        out = {}
        for pod in backend.kube.list("Pod", ns, selector):
            rank = pod["metadata"]["labels"].get(naming.RANK)
            if rank is not None:
                out[int(rank)] = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        return out

    envs = learner_envs()
    assert sorted(envs) == [0, 1], "an elastic job starts at its minimum"
    for rank, env in envs.items():
        assert env["PET_NNODES"] == "2:3" and env["PET_NPROC_PER_NODE"] == "1", env
        assert env["PET_RDZV_BACKEND"] == "c10d" and env["PET_RDZV_ID"] == "j-el-1", env
        assert env["PET_RDZV_ENDPOINT"] == f"127.0.0.1:{port}", env
        assert f"is_host={int(rank == 0)}" in env["PET_RDZV_CONF"], "the c10d store lives in slot 0"
        assert "RANK" not in env and "WORLD_SIZE" not in env, "torchrun numbers an elastic group, not the pod"
        assert env["TF_JOB_ID"] == "j-el"
    assert backend.kube.get("Service", ns, "tf-j-el-a1")["spec"]["ports"][0]["port"] == port
    assert lifecycle.grow("j-el", 1, 3)
    lifecycle.supervise_once()
    grown = wait_for(lambda: (e := learner_envs()) and len(e) == 3 and e, 30, "slot 2's pod")
    assert grown[2]["PET_NNODES"] == "2:3" and grown[2]["PET_RDZV_ENDPOINT"] == f"127.0.0.1:{port}"
    assert "is_host=0" in grown[2]["PET_RDZV_CONF"]
    assert lifecycle.grow("j-el", 1, 9)  # never beyond the maximum
    lifecycle.supervise_once()
    assert sorted(learner_envs()) == [0, 1, 2]

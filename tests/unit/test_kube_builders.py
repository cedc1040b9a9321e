"""The kubernetes backend's object builders, without a cluster: every object passes the upstream schemas
(`kubernetes-validate --strict`, Kubernetes 1.33) for a matrix of manifests, and carries what it should."""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path

import kubernetes_validate
import pytest

from trainforge_services.common.manifest import Manifest
from trainforge_services.lcm.backends.base import Site
from trainforge_services.lcm.backends.kubernetes import naming, pods, team
from trainforge_services.lcm.backends.kubernetes.naming import KubeOptions
from trainforge_services.lcm.lifecycle import JobDeployment, build_plan

VERSION = "1.33.0"
OPTS = KubeOptions(stack="s1", gpu_tolerations=({"key": "nvidia.com/gpu", "operator": "Exists",
                                                  "effect": "NoSchedule"},),
                   gpu_node_selectors={"h100": {"gpu.example/model": "h100-80g"}},
                   egress_cidrs=("10.0.3.4/32:2379", "10.0.9.0/24"),
                   platform_env={"TF_ETCD_ENDPOINTS": "etcd:2379", "TF_TRAINER_ADDRESS": "trainer:50051"})
OWNER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "tf-j-abc-a3", "uid": "0f6c2a51-6b0e-4a36-9a39-1d4e2b7c9e01"}


def plan_for(learners: int = 2, gpus: int = 0, gpu_type: str | None = None, data: bool = False,
             checkpoint: bool = False, secret: bool = False):
    fields: dict = {"name": "m", "learners": learners, "command": "python train.py {{lr}}", "params": {"lr": "0.1"},
                    "resources": {"gpus": gpus, "cpus": 1.5, "memory": "512Mi", "gpu_type": gpu_type}}
    if data:
        fields["data"] = [{"source": "store://datasets/mnist", "path": "data/mnist"}]
    if secret:
        fields["env"] = {"WANDB_KEY": {"secret": "wandb"}, "PLAIN": "1"}
    job = JobDeployment(job_id="j-abc", team="team-a", attempt=3, manifest=Manifest(**fields),
                        checkpoint_uri="store://jobs/j-abc/checkpoints/" if checkpoint else "",
                        secret_env={"WANDB_KEY": "s3cr3t"} if secret else {})
    site = Site(attempt_dir=Path(OPTS.workdir) / "j-abc" / "3", master_addr="tf-j-abc-a3-r0.tf-j-abc-a3",
                master_port=29517)
    return build_plan(job, site, list(range(gpus * learners)), lease_ttl=10, start_timeout=30)


def validate(obj: dict) -> None:
    kubernetes_validate.validate(obj, VERSION, strict=True)


MATRIX = list(itertools.product((1, 8), ((0, None), (2, None), (1, "h100"), (4, "a100")), (False, True),
                                (False, True)))


@pytest.mark.parametrize(("learners", "gpus", "data_and_checkpoint", "secret"), MATRIX)
def test_every_attempt_object_passes_the_strict_schema(learners, gpus, data_and_checkpoint, secret):
    plan = plan_for(learners, gpus[0], gpus[1], data=data_and_checkpoint, checkpoint=data_and_checkpoint,
                    secret=secret)
    objects = [pods.root_object(plan, OPTS), *pods.attempt_objects(plan, OPTS, OWNER)]
    for obj in objects:
        validate(obj)
    kinds = [o["kind"] for o in objects]
    assert kinds.count("Pod") == learners + 1
    assert kinds.count("Secret") == (1 if secret else 0)
    assert kinds.count("Service") == 1


@pytest.mark.parametrize("quota", [
    team.TeamQuota(),
    team.TeamQuota(gpus=4, cpus=16, memory=64 * 2**30, jobs=3),
    team.TeamQuota(gpus=8, gpus_by_type={"a100": 4, "h100": 2}, cpus=0.5)])
def test_every_team_object_passes_the_strict_schema(quota):
    objects = team.team_objects(OPTS, "team-a", quota, {"TF_S3_ACCESS_KEY": "ak", "TF_S3_SECRET_KEY": "sk"})
    for obj in objects:
        validate(obj)
    for gpu_type in quota.gpus_by_type:
        validate(team.priority_class(OPTS, gpu_type))


def test_a_schema_violation_is_caught():
    pod = pods.learner_pod(plan_for(), OPTS, plan_for().learners[0], OWNER)
    pod["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True  # misspelt: strict refuses it
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pod)


def env_of(pod: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_learner_pods_have_names_labels_ddp_env_and_owner():
    plan = plan_for(learners=3)
    objs = pods.attempt_objects(plan, OPTS, OWNER)
    learners = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"][naming.ROLE] == "learner"]
    assert [p["metadata"]["name"] for p in learners] == ["tf-j-abc-a3-r0", "tf-j-abc-a3-r1", "tf-j-abc-a3-r2"]
    for rank, pod in enumerate(learners):
        labels = pod["metadata"]["labels"]
        assert labels[naming.TEAM] == "team-a" and labels[naming.JOB] == "j-abc"
        assert labels[naming.ATTEMPT] == "3" and labels[naming.RANK] == str(rank)
        assert pod["metadata"]["namespace"] == "tf-team-a"
        assert pod["metadata"]["ownerReferences"] == [OWNER]
        env = env_of(pod)
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == \
            ("tf-j-abc-a3-r0.tf-j-abc-a3", "29517", str(rank), "3", "0")
        assert pod["spec"]["hostname"] == pod["metadata"]["name"] and pod["spec"]["subdomain"] == "tf-j-abc-a3"
        spec = json.loads(env[pods.SPEC_ENV])
        assert spec["rank"] == rank and spec["master_port"] == 29517
        assert pod["spec"]["containers"][0]["command"] == ["python3", "-m", pods.ENTRY_MODULE, "learner"]
    service = next(o for o in objs if o["kind"] == "Service")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["ports"][0]["port"] == 29517
    assert service["spec"]["selector"] == {naming.JOB: "j-abc", naming.ATTEMPT: "3", naming.ROLE: "learner"}


def test_every_pod_follows_the_restricted_profile():
    plan = plan_for(learners=2, gpus=1, gpu_type="h100")
    for pod in (o for o in pods.attempt_objects(plan, OPTS, OWNER) if o["kind"] == "Pod"):
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            ctx = dict(container["securityContext"])
            uid = ctx.pop("runAsUser", spec["securityContext"]["runAsUser"])
            assert ctx == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                           "readOnlyRootFilesystem": True, "runAsNonRoot": True}
            # the controller runs under a uid of its own; the learner under the pod's
            assert uid == (pods.CONTROLLER_UID if container["name"] == naming.CONTROLLER_CONTAINER else pods.RUN_AS)


def test_gpu_pods_get_limits_type_selector_tolerations_and_the_types_priority_class():
    plan = plan_for(learners=2, gpus=2, gpu_type="h100")
    pod = pods.learner_pod(plan, OPTS, plan.learners[1], OWNER)
    controller, learner = (c["resources"] for c in pod["spec"]["containers"])
    # the pod asks for the manifest's resources; the controller's share comes out of the learner's
    assert learner["limits"] == learner["requests"] == {"cpu": "1400m", "memory": str(256 * 2**20),
                                                        "nvidia.com/gpu": "2"}
    assert controller["limits"] == controller["requests"] == {"cpu": "100m", "memory": str(256 * 2**20)}
    assert pod["spec"]["nodeSelector"] == {"gpu.example/model": "h100-80g"}
    assert pod["spec"]["tolerations"] == [dict(t) for t in OPTS.gpu_tolerations]
    assert pod["spec"]["priorityClassName"] == "tf-gpu-h100"
    # the controller in the pod sees the container's own GPUs, not the LCM's accounting indices
    assert json.loads(env_of(pod)[pods.SPEC_ENV])["gpu_ids"] == [0, 1]
    other = pods.learner_pod(plan_for(gpus=1, gpu_type="a100"), OPTS, plan_for().learners[0], OWNER)
    assert other["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "a100"}
    cpu_only = pods.learner_pod(plan_for(), OPTS, plan_for().learners[0], OWNER)
    assert "nodeSelector" not in cpu_only["spec"] and "tolerations" not in cpu_only["spec"]


def test_secrets_come_from_secret_objects_never_from_plain_env_or_the_root():
    plan = plan_for(secret=True)
    root = pods.root_object(plan, OPTS)
    assert "s3cr3t" not in json.dumps(root)
    objs = pods.attempt_objects(plan, OPTS, OWNER)
    secret = next(o for o in objs if o["kind"] == "Secret")
    assert base64.b64decode(secret["data"]["WANDB_KEY"]).decode() == "s3cr3t"
    pod = next(o for o in objs if o["metadata"]["name"] == "tf-j-abc-a3-r0")
    assert "s3cr3t" not in json.dumps(pod)
    env = env_of(pod)
    assert env["TF_SECRET__WANDB_KEY"] == {"secretKeyRef": {"name": "tf-j-abc-a3-env", "key": "WANDB_KEY"}}
    assert env["TF_S3_SECRET_KEY"]["secretKeyRef"]["name"] == OPTS.platform_secret


def test_team_quota_mirrors_the_trainers_quota_with_room_for_monitors():
    quota = team.TeamQuota(gpus=4, cpus=8, memory=16 * 2**30, jobs=2, gpus_by_type={"a100": 2})
    objs = team.quota_objects(OPTS, "team-a", quota)
    hard = objs[0]["spec"]["hard"]
    assert hard["requests.nvidia.com/gpu"] == "4"
    assert hard["requests.cpu"] == hard["limits.cpu"] == "8200m"
    assert hard["requests.memory"] == str(16 * 2**30 + 2 * team.MONITOR_MEMORY)
    typed = objs[1]
    assert typed["metadata"]["name"] == "tf-gpu-a100" and typed["spec"]["hard"] == {"requests.nvidia.com/gpu": "2"}
    assert typed["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == ["tf-gpu-a100"]


def test_team_namespace_is_restricted_and_policies_deny_by_default():
    objs = team.team_objects(OPTS, "team-a", None, {})
    ns = objs[0]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert not any(o["kind"] == "ResourceQuota" for o in objs)
    policies = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "NetworkPolicy"}
    assert policies[team.POLICY_DENY] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    platform = policies[team.POLICY_PLATFORM]["egress"]
    assert {"to": [{"ipBlock": {"cidr": "10.0.3.4/32"}}], "ports": [{"protocol": "TCP", "port": 2379}]} in platform
    assert {"to": [{"ipBlock": {"cidr": "10.0.9.0/24"}}]} in platform


def test_names_are_dns_labels_and_ports_are_spread_per_attempt():
    assert naming.dns_label("Team_A") != "Team_A" and naming.dns_label("Team_A").startswith("team-a-")
    assert naming.namespace(OPTS, "team-a") == "tf-team-a"
    assert len(naming.dns_label("x" * 80)) <= 63
    assert naming.master_port("j-abc", 1, 29500, 0) == 29500
    ports = {naming.master_port("j-abc", a, 30000, 1000) for a in range(1, 30)}
    assert all(30000 <= p < 31000 for p in ports) and len(ports) > 20


def test_pods_are_told_the_platform_but_never_its_credentials(tmp_path):
    from trainforge_services.common.settings import LcmSettings

    settings = LcmSettings(state_dir=tmp_path, etcd_endpoints="etcd:2379", s3_secret_key="sk", mongo_url="mongodb://x")
    opts = KubeOptions.from_settings(settings, "s1")
    assert opts.platform_env["TF_ETCD_ENDPOINTS"] == "etcd:2379"
    # the LCM's own file:// store, resolved (a pod's TF_STATE_DIR is its attempt directory)
    assert opts.platform_env["TF_OBJECTSTORE_URL"] == (tmp_path / "objects").resolve().as_uri()
    assert "TF_S3_SECRET_KEY" not in opts.platform_env and "TF_MONGO_URL" not in opts.platform_env


def _learner_pod_with_grant(withheld: tuple[str, ...] = ()):
    from trainforge_services.lcm.backends.base import Grant

    grant = Grant(controller={"TF_ETCD_USER": "job-j-abc", "TF_ETCD_PASSWORD": "pw-ctl"},
                  monitor={"TF_TRAINER_TOKEN": "tok-mon"}, withheld=withheld)
    plan = plan_for(secret=True).model_copy(update={"grant": grant})
    return plan, pods.attempt_objects(plan, OPTS, OWNER)


def test_the_learner_container_holds_no_credential_and_mounts_no_secret():
    plan, objs = _learner_pod_with_grant()
    pod = next(o for o in objs if o["metadata"]["name"] == "tf-j-abc-a3-r0")
    spec = pod["spec"]
    assert spec["shareProcessNamespace"] is False and spec["automountServiceAccountToken"] is False
    controller, learner = spec["containers"]
    assert (controller["name"], learner["name"]) == (naming.CONTROLLER_CONTAINER, naming.LEARNER_CONTAINER)
    assert learner["command"] == ["python3", "-m", pods.WAITER_MODULE, naming.HANDOFF_PATH]
    assert {e["name"] for e in learner["env"]} == {"HOME"} and all("valueFrom" not in e for e in learner["env"])
    assert not any("secret" in v or "projected" in v for v in spec["volumes"])
    mounts = {m["name"]: m["mountPath"] for m in learner["volumeMounts"]}
    assert mounts == {"work": OPTS.workdir, "handoff": naming.HANDOFF_PATH, "learner-tmp": "/tmp"}
    text = json.dumps(learner)
    for value in ("s3cr3t", "pw-ctl", "tok-mon", "TF_S3", "TF_SECRET", "secretKeyRef", "TF_SPEC"):
        assert value not in text
    # the controller meets it in the shared volumes, with its own /tmp
    assert {m["name"] for m in controller["volumeMounts"]} == {"work", "handoff", "tmp"}
    assert env_of(pod)[pods.HANDOFF_ENV] == naming.HANDOFF_PATH


def test_the_grant_goes_into_the_attempts_credentials_secret_referenced_by_the_controller_and_monitor_only():
    plan, objs = _learner_pod_with_grant(withheld=("TF_S3_ACCESS_KEY", "TF_S3_SECRET_KEY", "TF_TRAINER_ADDRESS"))
    creds = next(o for o in objs if o["metadata"]["name"] == "tf-j-abc-a3-creds")
    assert creds["metadata"]["ownerReferences"] == [OWNER] and creds["metadata"]["labels"][naming.JOB] == "j-abc"
    data = {k: base64.b64decode(v).decode() for k, v in creds["data"].items()}
    assert data == {"controller.TF_ETCD_USER": "job-j-abc", "controller.TF_ETCD_PASSWORD": "pw-ctl",
                    "monitor.TF_TRAINER_TOKEN": "tok-mon"}
    pod = next(o for o in objs if o["metadata"]["name"] == "tf-j-abc-a3-r0")
    env = env_of(pod)
    assert env["TF_ETCD_PASSWORD"] == {"secretKeyRef": {"name": "tf-j-abc-a3-creds", "key": "controller.TF_ETCD_PASSWORD"}}
    # what the grant withholds is not given at all: the platform Secret's keys and the withheld settings
    assert "TF_S3_SECRET_KEY" not in env and "TF_S3_ACCESS_KEY" not in env and "TF_TRAINER_ADDRESS" not in env
    assert "TF_TRAINER_TOKEN" not in env
    monitor = next(o for o in objs if o["metadata"]["labels"].get(naming.ROLE) == "monitor")
    menv = env_of(monitor)
    assert menv["TF_TRAINER_TOKEN"] == {"secretKeyRef": {"name": "tf-j-abc-a3-creds", "key": "monitor.TF_TRAINER_TOKEN"}}
    assert "TF_ETCD_PASSWORD" not in menv and "TF_S3_SECRET_KEY" not in menv
    assert "pw-ctl" not in json.dumps(objs[1:]) and "pw-ctl" not in json.dumps(pods.root_object(plan, OPTS))
    for obj in objs:
        validate(obj)
    # without a grant of its own there is no credentials Secret
    assert not any(o["metadata"]["name"].endswith("-creds") for o in pods.attempt_objects(plan_for(), OPTS, OWNER))

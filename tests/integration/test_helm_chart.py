"""The Helm chart `deploy/helm/trainforge`: `helm lint --strict` is clean, `helm template` output passes the
upstream schemas strictly (kubernetes-validate, 1.33), the values schema refuses bad values naming them, and
every value in values.yaml carries a comment. helm comes from `make kube-clients` (tools/kube/clients.sh);
without it these tests fail, never skip. `helm install` against a real API server is in test_kube_backend.py."""

from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests import toolcache

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "trainforge"
HELM = toolcache.where("kube-clients") / "helm"
VERSION = "1.33.0"

pytestmark = pytest.mark.integration


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: run `make kube-clients` (tools/kube/clients.sh)")
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120, check=check)


def rendered(*sets: str, kube_version: str = VERSION) -> list[dict]:
    args = ["template", "tf", str(CHART), "--namespace", "trainforge", "--kube-version", kube_version]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


@pytest.mark.parametrize("kube_version", [VERSION, "1.20.2"])
def test_helm_lint_strict_is_clean(kube_version):
    out = helm("lint", "--strict", "--kube-version", kube_version, str(CHART), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout


@pytest.mark.parametrize("sets", [(), ("probes.mode=exec", "networkPolicy.enabled=false", "api.replicas=1"),
                                  ("mongo.existingSecret=mongo-url", "logstore.existingSecret=es-url",
                                   "imagePullSecrets={regcred}"),
                                  ("etcd.auth.enabled=true",),
                                  ("etcd.auth.enabled=true", "etcd.auth.existingSecret=etcd-pw",
                                   "imagePullSecrets={regcred}")])
def test_every_rendered_object_passes_the_strict_schema(sets):
    docs = rendered(*sets)
    for doc in docs:
        kubernetes_validate.validate(doc, VERSION, strict=True)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("Deployment") == 3 and kinds.count("PodDisruptionBudget") == 3
    assert kinds.count("ServiceAccount") == 3 and "ClusterRole" in kinds


def test_the_chart_sets_probes_resources_security_and_secret_references():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in rendered()}
    lcm = docs[("Deployment", "tf-lcm")]["spec"]["template"]["spec"]
    container = lcm["containers"][0]
    assert container["livenessProbe"]["grpc"] == {"port": 50052}
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert lcm["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["TF_BACKEND"]["value"] == "kubernetes"
    assert env["TF_S3_SECRET_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "trainforge-s3", "key": "secret-key"}
    api = docs[("Deployment", "tf-api")]["spec"]["template"]["spec"]
    assert api["automountServiceAccountToken"] is False
    api_env = {e["name"]: e for e in api["containers"][0]["env"]}
    assert api_env["TF_JWT_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "trainforge-keys"
    exec_probe = {(d["kind"], d["metadata"]["name"]): d for d in rendered("probes.mode=exec")}
    probe = exec_probe[("Deployment", "tf-trainer")]["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    assert "grpc_health" in probe["exec"]["command"][-1] and "50051" in probe["exec"]["command"][-1]


def test_etcd_auth_gives_each_service_its_login_from_a_secret_and_a_setup_job():
    off = {(d["kind"], d["metadata"]["name"]) for d in rendered()}
    assert ("Secret", "tf-etcd-auth") not in off and ("Job", "tf-etcd-setup") not in off  # off: nothing of it
    docs = {(d["kind"], d["metadata"]["name"]): d for d in rendered("etcd.auth.enabled=true")}
    secret = docs[("Secret", "tf-etcd-auth")]
    assert set(secret["data"]) == {"root-password", "trainer-password", "lcm-password"}
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for service in ("trainer", "lcm"):
        container = docs[("Deployment", f"tf-{service}")]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        assert env["TF_ETCD_USER"]["value"] == f"trainforge-{service}"
        assert env["TF_ETCD_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "tf-etcd-auth",
                                                                        "key": f"{service}-password"}
        assert env["TF_CREDENTIALS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "tf-service-auth",
                                                                          "key": "credentials-key"}
    api = docs[("Deployment", "tf-api")]["spec"]["template"]["spec"]["containers"][0]
    assert not {"TF_ETCD_USER", "TF_ETCD_PASSWORD"} & {e["name"] for e in api["env"]}
    job = docs[("Job", "tf-etcd-setup")]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    setup = job["spec"]["template"]["spec"]["containers"][0]
    assert setup["command"][-1] == "trainforge_services.lcm.etcd_setup"
    assert {e["name"] for e in setup["env"]} >= {"TF_ETCD_ROOT_PASSWORD", "TF_ETCD_LCM_PASSWORD"}
    theirs = rendered("etcd.auth.enabled=true", "etcd.auth.existingSecret=etcd-pw")
    assert ("Secret", "tf-etcd-auth") not in {(d["kind"], d["metadata"]["name"]) for d in theirs}
    lcm = next(d for d in theirs if (d["kind"], d["metadata"]["name"]) == ("Deployment", "tf-lcm"))
    lcm = lcm["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e for e in lcm["env"]}["TF_ETCD_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "etcd-pw"


def test_the_lcm_role_is_least_privilege():
    role = next(d for d in rendered() if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
        assert "pods/exec" not in rule["resources"]
    nodes = next(r for r in role["rules"] if "nodes" in r["resources"])
    assert set(nodes["verbs"]) == {"get", "list"}


def test_a_pdb_version_the_cluster_has():
    old = [d for d in rendered(kube_version="1.20.2") if d["kind"] == "PodDisruptionBudget"]
    new = [d for d in rendered() if d["kind"] == "PodDisruptionBudget"]
    assert {d["apiVersion"] for d in old} == {"policy/v1beta1"} and {d["apiVersion"] for d in new} == {"policy/v1"}


@pytest.mark.parametrize(("value", "field"), [("lcm.replicas=9", "lcm.replicas"),
                                               ("mongo.url=localhost", "mongo.url"),
                                               ("probes.mode=http", "probes.mode"),
                                               ("lcm.egressCidrs={not-a-cidr}", "lcm.egressCidrs")])
def test_the_values_schema_names_a_bad_value(value, field):
    out = helm("template", "tf", str(CHART), "--set", value, check=False)
    assert out.returncode != 0 and field in out.stderr


def test_every_value_has_a_comment():
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][A-Za-z0-9]*):", line)
        if not m:
            continue
        above = lines[i - 1].strip() if i else ""
        assert above.startswith("#"), f"values.yaml line {i + 1} ({m.group(2)}) has no comment above it"


def test_replicas_elect_a_leader_and_only_the_lcm_leader_is_ready():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in rendered()}

    def env(name: str) -> dict:
        container = docs[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    for name in ("tf-trainer", "tf-lcm"):
        deployment = docs[("Deployment", name)]["spec"]
        assert deployment["replicas"] == 2 and deployment["strategy"]["type"] == "RollingUpdate"
        assert env(name)["TF_ELECT"] == "true"
        assert docs[("PodDisruptionBudget", name)]["spec"]["maxUnavailable"] == 1
    assert env("tf-api")["TF_RATE_LIMIT_SHARED"] == "true"
    assert docs[("ConfigMap", "tf-config")]["data"]["TF_LEADER_TTL"] == "5"
    lcm = docs[("Deployment", "tf-lcm")]["spec"]["template"]["spec"]["containers"][0]
    assert lcm["readinessProbe"]["grpc"] == {"port": 50052, "service": "trainforge.LifecycleManager"}
    assert lcm["livenessProbe"]["grpc"] == {"port": 50052}

    single = {(d["kind"], d["metadata"]["name"]): d for d in rendered("trainer.replicas=1", "lcm.replicas=1")}
    for name in ("tf-trainer", "tf-lcm"):
        assert single[("Deployment", name)]["spec"]["strategy"] == {"type": "Recreate"}


def test_the_service_token_reaches_the_api_trainer_and_lcm_only_from_a_secret_the_chart_makes_or_is_given():
    def envs(docs: list[dict]) -> dict[str, dict]:
        return {d["metadata"]["name"]: {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
                for d in docs if d["kind"] == "Deployment"}

    own = rendered()
    secret = next(d for d in own if d["kind"] == "Secret" and d["metadata"]["name"] == "tf-service-auth")
    assert set(secret["data"]) == {"service-token", "credentials-key"}
    assert all(len(base64.b64decode(v)) >= 32 for v in secret["data"].values())
    # a new token on every render (install, upgrade): the pods carry the release revision, so they roll with it
    assert next(d for d in rendered() if d["kind"] == "Secret" and d["metadata"]["name"] == "tf-service-auth")[
        "data"]["service-token"] != secret["data"]["service-token"]
    deployments = [d for d in own if d["kind"] == "Deployment"]
    assert all(d["spec"]["template"]["metadata"]["annotations"] == {"trainforge.io/service-auth-revision": "1"}
               for d in deployments)
    env = envs(own)
    for name in ("tf-api", "tf-trainer", "tf-lcm"):
        assert env[name]["TF_SERVICE_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "tf-service-auth",
                                                                              "key": "service-token"}
    for name in ("tf-api", "tf-trainer", "tf-lcm"):
        assert env[name]["TF_CREDENTIALS_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "credentials-key"
    # nothing else the chart renders holds either (ConfigMap values, other objects)
    assert "service-token" not in yaml.safe_dump([d for d in own if d["kind"] not in ("Secret", "Deployment")])

    given = rendered("serviceAuth.existingSecret=platform-auth", "serviceAuth.serviceTokenKey=token")
    assert ("Secret", "tf-service-auth") not in {(d["kind"], d["metadata"]["name"]) for d in given}
    env = envs(given)
    assert env["tf-lcm"]["TF_SERVICE_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "platform-auth", "key": "token"}
    assert all("annotations" not in d["spec"]["template"]["metadata"] for d in given if d["kind"] == "Deployment")


def test_only_the_api_and_the_trainer_get_the_store_connection_strings_from_a_secret():
    def envs(*sets: str) -> dict[str, dict]:
        docs = rendered(*sets)
        out = {d["metadata"]["name"]: {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
               for d in docs if d["kind"] == "Deployment"}
        out["secrets"] = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
        return out

    own = envs()
    assert own["secrets"]["tf-stores"]["stringData"] == {"mongo-url": "mongodb://mongodb:27017",
                                                         "logstore-url": "http://elasticsearch:9200"}
    for name in ("tf-api", "tf-trainer"):
        assert own[name]["TF_MONGO_URL"]["valueFrom"]["secretKeyRef"] == {"name": "tf-stores", "key": "mongo-url"}
        assert own[name]["TF_LOGSTORE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "tf-stores",
                                                                            "key": "logstore-url"}
    # the LCM holds neither credential: what learner pods are told is the plain address
    assert "TF_MONGO_URL" not in own["tf-lcm"]
    assert own["tf-lcm"]["TF_LOGSTORE_URL"] == {"name": "TF_LOGSTORE_URL", "value": "http://elasticsearch:9200"}

    existing = envs("mongo.existingSecret=mongo-creds", "mongo.secretKey=uri", "logstore.existingSecret=es-creds")
    assert "tf-stores" not in existing["secrets"]
    assert existing["tf-api"]["TF_MONGO_URL"]["valueFrom"]["secretKeyRef"] == {"name": "mongo-creds", "key": "uri"}
    assert existing["tf-trainer"]["TF_LOGSTORE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "es-creds",
                                                                                     "key": "url"}


@pytest.mark.parametrize("value", ["mongo.url=mongodb://user:pw@mongodb:27017", "logstore.url=http://u:p@es:9200"])
def test_credentials_in_a_plain_url_value_are_refused(value):
    out = helm("template", "tf", str(CHART), "--set", value, check=False)
    assert out.returncode != 0 and value.split("=")[0] in out.stderr

"""Names, labels and the builders' options: what every kubernetes object of the platform is called and carries.

Every object carries `app.kubernetes.io/managed-by=trainforge` and `tf.stack`
(the LCM that made it); a team's objects `tf.team`; an attempt's objects
`tf.job` and `tf.attempt`, learner pods `tf.rank` and `tf.role`. Adoption
after an LCM restart, observation and the fallback delete all go by these
labels, never by names alone.

`KubeOptions` is the part of `LcmSettings` the pure builders read, so the
builders take no settings object and the static tests build a matrix of them.
"""

from __future__ import annotations

import hashlib
import re

from pydantic import BaseModel, ConfigDict, Field

from trainforge_services.common.settings import LcmSettings

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "trainforge"
STACK = "tf.stack"
TEAM = "tf.team"
JOB = "tf.job"
ATTEMPT = "tf.attempt"
RANK = "tf.rank"
ROLE = "tf.role"
GPU_RESOURCE = "nvidia.com/gpu"
# the container the monitor pod runs the injected entrypoint in
CONTAINER = "main"
# a learner pod's two containers: the controller (the injected entrypoint, the job's credentials) and the
# learner (the waiter, no credential); and where both mount the emptyDir they meet in
CONTROLLER_CONTAINER = "controller"
LEARNER_CONTAINER = "learner"
HANDOFF_PATH = "/var/lib/trainforge/handoff"
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


class KubeOptions(BaseModel):
    """What the object builders need to know about the cluster and the platform."""

    model_config = ConfigDict(frozen=True)

    stack: str = "default"
    namespace_prefix: str = "tf-"
    image: str = "trainforge/learner:torch"
    platform_image: str = "trainforge/platform:latest"
    pull_policy: str = "IfNotPresent"
    python: str = "python3"
    pythonpath: str = ""
    workdir: str = "/var/lib/trainforge/work"
    gpu_type_label: str = "nvidia.com/gpu.product"
    gpu_node_selectors: dict[str, dict[str, str]] = Field(default_factory=dict)
    gpu_tolerations: tuple[dict[str, str], ...] = ()
    platform_namespace: str = "trainforge"
    egress_cidrs: tuple[str, ...] = ()
    # TF_* settings every monitor and controller reads (etcd, stores, trainer), credentials excluded
    platform_env: dict[str, str] = Field(default_factory=dict)
    # the name of the Secret (in each team namespace) holding the platform credentials the pods read
    platform_secret: str = "trainforge-platform"

    @classmethod
    def from_settings(cls, settings: LcmSettings, stack: str) -> KubeOptions:
        env = {k: v for k, v in settings.to_env().items() if k in _PLATFORM_ENV}
        # resolved here: a pod's own state directory is not the LCM's (an embedded stack's file:// store)
        env["TF_OBJECTSTORE_URL"] = settings.objectstore()
        return cls(stack=stack, namespace_prefix=settings.kube_namespace_prefix, image=settings.kube_image,
                   platform_image=settings.kube_platform_image, pull_policy=settings.kube_image_pull_policy,
                   python=settings.kube_python, pythonpath=settings.kube_pythonpath, workdir=settings.kube_workdir,
                   gpu_type_label=settings.kube_gpu_type_label, gpu_node_selectors=settings.kube_gpu_node_selectors,
                   gpu_tolerations=tuple(settings.kube_gpu_tolerations),
                   platform_namespace=settings.kube_platform_namespace,
                   egress_cidrs=tuple(settings.kube_egress_cidrs), platform_env=env)


# what pods are told of the platform (StoreSettings); the S3 keys come from the platform Secret instead
_PLATFORM_ENV = frozenset({
    "TF_ETCD_ENDPOINTS", "TF_ETCD_PREFIX", "TF_LOGSTORE_URL", "TF_LOGSTORE_INDEX", "TF_OBJECTSTORE_URL",
    "TF_S3_ENDPOINT", "TF_S3_REGION", "TF_TRAINER_ADDRESS", "TF_LOG_JSON", "TF_LEASE_TTL"})
# the platform Secret's keys, each the variable it becomes in a pod
PLATFORM_SECRET_KEYS = ("TF_S3_ACCESS_KEY", "TF_S3_SECRET_KEY")


def dns_label(value: str, limit: int = 63) -> str:
    """`value` as a DNS-1123 label; a value that had to change (or be cut) gets a hash of the original."""
    clean = _DNS_LABEL.sub("-", value.lower()).strip("-")
    if clean == value and len(clean) <= limit:
        return clean
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"{clean[:limit - 9].strip('-')}-{digest}".strip("-")


def namespace(opts: KubeOptions, team: str) -> str:
    return dns_label(f"{opts.namespace_prefix}{team}")


def label_value(value: str) -> str:
    """A label value (63 characters of [A-Za-z0-9._-]); team names and job ids already are."""
    return dns_label(value)


def attempt_name(job_id: str, attempt: int) -> str:
    """The attempt's root ConfigMap and headless Service."""
    return f"tf-{job_id}-a{attempt}"


def learner_name(job_id: str, attempt: int, rank: int) -> str:
    return f"tf-{job_id}-a{attempt}-r{rank}"


def monitor_name(job_id: str, attempt: int) -> str:
    return f"tf-{job_id}-a{attempt}-monitor"


def secret_name(job_id: str, attempt: int) -> str:
    """The attempt's Secret with the team secrets its manifest names."""
    return f"tf-{job_id}-a{attempt}-env"


def credentials_name(job_id: str, attempt: int) -> str:
    """The attempt's Secret with the job's own credentials (the lifecycle's grant) for its controllers and monitor."""
    return f"tf-{job_id}-a{attempt}-creds"


def team_labels(opts: KubeOptions, team: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, STACK: label_value(opts.stack), TEAM: label_value(team)}


def job_selector(opts: KubeOptions, job_id: str) -> str:
    return f"{MANAGED_BY}={MANAGER},{STACK}={label_value(opts.stack)},{JOB}={job_id}"


def attempt_labels(opts: KubeOptions, team: str, job_id: str, attempt: int) -> dict[str, str]:
    return {**team_labels(opts, team), JOB: job_id, ATTEMPT: str(attempt)}


def master_port(job_id: str, attempt: int, base: int, span: int) -> int:
    """The attempt's rendezvous port: `base`, or with a span one hashed from (job, attempt) into it."""
    if span <= 0:
        return base
    digest = int(hashlib.sha256(f"{job_id}/{attempt}".encode()).hexdigest(), 16)
    return min(base + digest % span, 65535)

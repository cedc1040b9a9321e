"""A team's standing objects: namespace, ResourceQuota(s), LimitRange, NetworkPolicies, the platform Secret.

Pure functions from a team and its quota to plain dicts (the API's JSON
shapes), so they are validated against the upstream schemas in the static
tier and applied as they are by the adapter.

- The namespace enforces the `restricted` pod-security profile.
- `tf-quota` mirrors the Trainer's team quota: `requests.nvidia.com/gpu`,
  CPU and memory (requests and limits, plus room for one job monitor pod per
  allowed job, since monitors run in the team's namespace too).
- Per GPU type a ResourceQuota `tf-gpu-<type>` scoped to the PriorityClass
  `tf-gpu-<type>`, which learner pods of that type carry: Kubernetes quotas
  cannot select on node selectors, but they can on a PriorityClass (GA since
  1.17); the classes all have value 0, so scheduling order is unchanged.
- The LimitRange gives any container without requests the monitor's
  defaults, so a quota on CPU and memory never refuses a pod for lacking them.
- NetworkPolicies: everything denied in and out, then allowed between pods
  of the same job (DDP), to DNS, to the platform's namespace, and to the
  configured outside endpoints (etcd, object store, log store).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from trainforge_services.lcm.backends.base import TeamQuota
from trainforge_services.lcm.backends.kubernetes.naming import (
    JOB,
    KubeOptions,
    dns_label,
    namespace,
    team_labels,
)

__all__ = ["TeamQuota"]

QUOTA_NAME = "tf-quota"
LIMITS_NAME = "tf-limits"
# what one job monitor pod asks for (and the LimitRange's defaults)
MONITOR_CPU_MILLI = 100
MONITOR_MEMORY = 256 * 2**20
POLICY_DENY = "tf-default-deny"
POLICY_SAME_JOB = "tf-allow-same-job"
POLICY_DNS = "tf-allow-dns"
POLICY_PLATFORM = "tf-allow-platform"


def gpu_class(gpu_type: str) -> str:
    """The PriorityClass (and per-type quota) name of a GPU type."""
    return dns_label(f"tf-gpu-{gpu_type}")


def cpu_quantity(cpus: float) -> str:
    return f"{round(cpus * 1000)}m"


def namespace_object(opts: KubeOptions, team: str) -> dict:
    labels = {**team_labels(opts, team), "pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace(opts, team), "labels": labels}}


def _meta(opts: KubeOptions, team: str, name: str) -> dict:
    return {"name": name, "namespace": namespace(opts, team), "labels": team_labels(opts, team)}


def quota_objects(opts: KubeOptions, team: str, quota: TeamQuota) -> list[dict]:
    """`tf-quota` and one `tf-gpu-<type>` per typed GPU limit."""
    hard: dict[str, str] = {}
    monitors = quota.jobs if quota.jobs is not None else 0
    if quota.gpus is not None:
        hard["requests.nvidia.com/gpu"] = str(quota.gpus)
    if quota.cpus is not None:
        cpu = cpu_quantity(quota.cpus + monitors * MONITOR_CPU_MILLI / 1000)
        hard["requests.cpu"] = hard["limits.cpu"] = cpu
    if quota.memory is not None:
        memory = str(quota.memory + monitors * MONITOR_MEMORY)
        hard["requests.memory"] = hard["limits.memory"] = memory
    out = [{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": _meta(opts, team, QUOTA_NAME),
            "spec": {"hard": hard}}]
    for gpu_type, limit in sorted(quota.gpus_by_type.items()):
        out.append({"apiVersion": "v1", "kind": "ResourceQuota",
                    "metadata": _meta(opts, team, gpu_class(gpu_type)),
                    "spec": {"hard": {"requests.nvidia.com/gpu": str(limit)},
                             "scopeSelector": {"matchExpressions": [
                                 {"scopeName": "PriorityClass", "operator": "In",
                                  "values": [gpu_class(gpu_type)]}]}}})
    return out


def priority_class(opts: KubeOptions, gpu_type: str) -> dict:
    """The cluster-wide PriorityClass learner pods of a GPU type carry (value 0: it only scopes quotas)."""
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": gpu_class(gpu_type), "labels": {"app.kubernetes.io/managed-by": "trainforge"}},
            "value": 0, "globalDefault": False, "preemptionPolicy": "Never",
            "description": f"trainforge learners on {gpu_type} GPUs; scopes the teams' per-type GPU quotas"}


def limit_range(opts: KubeOptions, team: str) -> dict:
    default = {"cpu": f"{MONITOR_CPU_MILLI}m", "memory": str(MONITOR_MEMORY)}
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": _meta(opts, team, LIMITS_NAME),
            "spec": {"limits": [{"type": "Container", "default": default, "defaultRequest": default}]}}


def _port_rule(cidr: str) -> dict:
    block, _, port = cidr.partition(":")
    rule: dict = {"to": [{"ipBlock": {"cidr": block}}]}
    if port:
        rule["ports"] = [{"protocol": "TCP", "port": int(port)}]
    return rule


def network_policies(opts: KubeOptions, team: str) -> list[dict]:
    """Default deny, then same job, DNS, the platform's namespace and its configured outside endpoints."""
    def policy(name: str, spec: dict) -> dict:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": _meta(opts, team, name), "spec": spec}

    # traffic between the pods of one job is allowed by a policy per attempt (`job_policy`, owned by its root)
    platform_ns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": opts.platform_namespace}}}
    egress_platform: list[dict] = [{"to": [platform_ns]}]
    egress_platform += [_port_rule(c) for c in opts.egress_cidrs]
    return [
        policy(POLICY_DENY, {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        policy(POLICY_DNS, {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
            "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]}),
        policy(POLICY_PLATFORM, {"podSelector": {}, "policyTypes": ["Egress"], "egress": egress_platform}),
    ]


def job_policy(opts: KubeOptions, team: str, job_id: str, name: str) -> dict:
    """Pods of one job may talk to each other (DDP), in both directions; nothing else comes in."""
    same = {"podSelector": {"matchLabels": {JOB: job_id}}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(opts, team, name),
            "spec": {"podSelector": {"matchLabels": {JOB: job_id}}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [same]}], "egress": [{"to": [same]}]}}


def platform_secret(opts: KubeOptions, team: str, values: Mapping[str, str]) -> dict:
    """The platform credentials (object store keys) pods of the team's namespace read (Secrets are namespaced)."""
    data = {k: base64.b64encode(v.encode()).decode() for k, v in sorted(values.items())}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(opts, team, opts.platform_secret),
            "type": "Opaque", "data": data}


def team_objects(opts: KubeOptions, team: str, quota: TeamQuota | None,
                 credentials: Mapping[str, str]) -> list[dict]:
    """Everything a team's namespace holds, namespace first; without a quota no ResourceQuota is made."""
    out = [namespace_object(opts, team), limit_range(opts, team), *network_policies(opts, team),
           platform_secret(opts, team, credentials)]
    if quota is not None:
        out += quota_objects(opts, team, quota)
    return out

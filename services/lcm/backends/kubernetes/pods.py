"""An attempt's objects: the root ConfigMap, and what it owns (Secret, headless Service, policy, pods).

Pure functions from an `AttemptPlan` to plain dicts (the API's JSON shapes).

- The root is a ConfigMap `tf-<job>-a<attempt>` holding the attempt's plan
  (`plan.json`, secret values left out; a restarted LCM adopts from it). Every other
  object names it as its owner, so deleting the root lets the garbage
  collector remove the whole attempt.
- One pod per rank, `tf-<job>-a<attempt>-r<rank>`, whose hostname and
  subdomain put it under the headless Service `tf-<job>-a<attempt>`: rank
  0's DNS name is the DDP rendezvous (`MASTER_ADDR`), PyTorchJob's pattern.
- The job monitor as its own pod `tf-<job>-a<attempt>-monitor`.
- The controller is injected as each learner pod's entrypoint (`entry.py`):
  it starts the learner's command as its child exactly as on the local
  backend, so its contract (status lease, halt, checkpoints, logs, outputs)
  is unchanged. docs/KUBERNETES.md says why not a sidecar.
- Every pod follows the `restricted` profile (non-root, no privilege
  escalation, no capabilities, RuntimeDefault seccomp, read-only root
  filesystem with emptyDirs for the workdir and /tmp), mounts no service
  account token, and reads credentials from Secrets: the platform's
  (object-store keys) and the attempt's (the team secrets its manifest names).
"""

from __future__ import annotations

import base64

from trainforge_frameworks.torch.launch import elastic_env, elastic_restarts
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.lcm.backends.base import AttemptPlan
from trainforge_services.lcm.backends.kubernetes import naming

# what the injected entrypoint reads: the spec as JSON, and each team secret as TF_SECRET__<VAR>
from trainforge_services.lcm.backends.kubernetes.entry import ATTEMPT_DIR_ENV, SECRET_PREFIX, SPEC_ENV
from trainforge_services.lcm.backends.kubernetes.naming import (
    CONTAINER,
    GPU_RESOURCE,
    RANK,
    ROLE,
    KubeOptions,
    attempt_labels,
    attempt_name,
    learner_name,
    monitor_name,
    namespace,
    secret_name,
)
from trainforge_services.lcm.backends.kubernetes.team import (
    MONITOR_CPU_MILLI,
    MONITOR_MEMORY,
    cpu_quantity,
    gpu_class,
    job_policy,
)

ENTRY_MODULE = "trainforge_services.lcm.backends.kubernetes.entry"
PLAN_KEY = "plan.json"
RUN_AS = 1000
ROLE_LEARNER = "learner"
ROLE_MONITOR = "monitor"


def pod_spec_of(spec: LearnerSpec) -> LearnerSpec:
    """The learner spec a pod gets: its GPUs are the container's own 0..n-1 (the device plugin picks which)."""
    return spec.model_copy(update={"gpu_ids": list(range(len(spec.gpu_ids))), "secret_env": {}})


def root_object(plan: AttemptPlan, opts: KubeOptions) -> dict:
    # the whole plan (secret values excluded by its model): a restarted LCM adopts the attempt from it
    data = {PLAN_KEY: plan.model_dump_json()}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": attempt_name(plan.job_id, plan.attempt), "namespace": namespace(opts, plan.team),
                         "labels": attempt_labels(opts, plan.team, plan.job_id, plan.attempt)},
            "data": data}


def owner_reference(root: dict) -> dict:
    """A reference to the created root (it needs the uid the API server gave it)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": root["metadata"]["name"],
            "uid": root["metadata"]["uid"]}


def _meta(plan: AttemptPlan, opts: KubeOptions, name: str, owner: dict, **extra: str) -> dict:
    labels = {**attempt_labels(opts, plan.team, plan.job_id, plan.attempt), **extra}
    return {"name": name, "namespace": namespace(opts, plan.team), "labels": labels, "ownerReferences": [owner]}


def _security() -> tuple[dict, dict]:
    pod = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
           "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                 "readOnlyRootFilesystem": True, "runAsNonRoot": True}
    return pod, container


def _platform_env(plan: AttemptPlan, opts: KubeOptions) -> list[dict]:
    env = {**opts.platform_env, "TF_STACK_ID": opts.stack, "TF_STATE_DIR": str(plan.attempt_dir),
           "TF_ISOLATION": "none", "HOME": "/tmp", ATTEMPT_DIR_ENV: str(plan.attempt_dir)}
    if opts.pythonpath:
        env["PYTHONPATH"] = opts.pythonpath
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def _platform_credentials(opts: KubeOptions) -> list[dict]:
    return [{"name": key, "valueFrom": {"secretKeyRef": {"name": opts.platform_secret, "key": key,
                                                          "optional": True}}}
            for key in naming.PLATFORM_SECRET_KEYS]


def _pod(plan: AttemptPlan, opts: KubeOptions, name: str, owner: dict, *, role: str, image: str, env: list[dict],
         resources: dict, extra_labels: dict[str, str] | None = None, spec_extra: dict | None = None) -> dict:
    pod_security, container_security = _security()
    container = {"name": CONTAINER, "image": image, "imagePullPolicy": opts.pull_policy,
                 "command": [opts.python, "-m", ENTRY_MODULE, role], "env": env, "resources": resources,
                 "securityContext": container_security,
                 "volumeMounts": [{"name": "work", "mountPath": opts.workdir}, {"name": "tmp", "mountPath": "/tmp"}]}
    spec = {"restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
            "securityContext": pod_security, "containers": [container],
            "volumes": [{"name": "work", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
            **(spec_extra or {})}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(plan, opts, name, owner, **{ROLE: role, **(extra_labels or {})}), "spec": spec}


def monitor_pod(plan: AttemptPlan, opts: KubeOptions, owner: dict) -> dict:
    quantity = {"cpu": f"{MONITOR_CPU_MILLI}m", "memory": str(MONITOR_MEMORY)}
    env = [*_platform_env(plan, opts), {"name": SPEC_ENV, "value": plan.monitor.to_json()}]
    return _pod(plan, opts, monitor_name(plan.job_id, plan.attempt), owner, role=ROLE_MONITOR,
                image=opts.platform_image, env=env, resources={"requests": quantity, "limits": quantity})


def learner_pod(plan: AttemptPlan, opts: KubeOptions, spec: LearnerSpec, owner: dict) -> dict:
    res = plan.manifest.resources
    quantity = {"cpu": cpu_quantity(res.cpus), "memory": str(res.memory)}
    extra: dict = {"hostname": learner_name(plan.job_id, plan.attempt, spec.rank),
                   "subdomain": attempt_name(plan.job_id, plan.attempt)}
    if res.gpus:
        quantity[GPU_RESOURCE] = str(res.gpus)
        if opts.gpu_tolerations:
            extra["tolerations"] = [dict(t) for t in opts.gpu_tolerations]
        if res.gpu_type:
            extra["nodeSelector"] = dict(opts.gpu_node_selectors.get(res.gpu_type)
                                         or {opts.gpu_type_label: res.gpu_type})
            extra["priorityClassName"] = gpu_class(res.gpu_type)
    ddp = rendezvous_env(plan, spec)
    env = [*_platform_env(plan, opts), *_platform_credentials(opts),
           *({"name": k, "value": v} for k, v in sorted(ddp.items())),
           {"name": SPEC_ENV, "value": pod_spec_of(spec).to_json()}]
    env += [{"name": f"{SECRET_PREFIX}{var}",
             "valueFrom": {"secretKeyRef": {"name": secret_name(plan.job_id, plan.attempt), "key": var}}}
            for var in sorted(plan.manifest.secret_env())]
    return _pod(plan, opts, learner_name(plan.job_id, plan.attempt, spec.rank), owner, role=ROLE_LEARNER,
                image=plan.manifest.image or opts.image, env=env, resources={"requests": quantity, "limits": quantity},
                extra_labels={RANK: str(spec.rank)}, spec_extra=extra)


def rendezvous_env(plan: AttemptPlan, spec: LearnerSpec) -> dict[str, str]:
    """The pod's rendezvous variables: DDP's env:// for a fixed-size job; for an elastic one the torchrun
    agent's PET_* (c10d store in slot 0's pod, at rank 0's DNS name), as the controller gives its learner."""
    if not plan.manifest.elastic:
        return {"MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(spec.master_port), "RANK": str(spec.rank),
                "WORLD_SIZE": str(spec.world_size), "LOCAL_RANK": "0", "TF_JOB_ID": plan.job_id}
    return {**elastic_env(min_nodes=plan.manifest.min_learners, max_nodes=plan.manifest.max_learners,
                          endpoint_host=spec.master_addr, endpoint_port=spec.master_port,
                          run_id=f"{plan.job_id}-{plan.attempt}", max_restarts=elastic_restarts(plan.manifest.max_learners,
                                                                       plan.manifest.restart.max_restarts),
                          host_store=spec.rank == 0),
            "TF_JOB_ID": plan.job_id}


def rendezvous_service(plan: AttemptPlan, opts: KubeOptions, owner: dict) -> dict:
    name = attempt_name(plan.job_id, plan.attempt)
    selector = {naming.JOB: plan.job_id, naming.ATTEMPT: str(plan.attempt), ROLE: ROLE_LEARNER}
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(plan, opts, name, owner),
            "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": True,
                     "ports": [{"name": "rendezvous", "protocol": "TCP", "port": plan.master_port,
                                "targetPort": plan.master_port}]}}


def env_secret(plan: AttemptPlan, opts: KubeOptions, owner: dict) -> dict | None:
    """The team secrets the manifest names, by variable (None without any)."""
    wanted = plan.manifest.secret_env()
    if not wanted:
        return None
    data = {var: base64.b64encode(plan.secret_env.get(var, "").encode()).decode() for var in sorted(wanted)}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(plan, opts, secret_name(plan.job_id, plan.attempt), owner), "data": data}


def attempt_objects(plan: AttemptPlan, opts: KubeOptions, owner: dict) -> list[dict]:
    """What the root owns, in creation order: Secret, Service, NetworkPolicy, the monitor, the learners."""
    policy = job_policy(opts, plan.team, plan.job_id, attempt_name(plan.job_id, plan.attempt))
    policy["metadata"]["labels"] = attempt_labels(opts, plan.team, plan.job_id, plan.attempt)
    policy["metadata"]["ownerReferences"] = [owner]
    out = [o for o in (env_secret(plan, opts, owner),) if o is not None]
    out += [rendezvous_service(plan, opts, owner), policy, monitor_pod(plan, opts, owner)]
    out += [learner_pod(plan, opts, spec, owner) for spec in plan.learners]
    return out

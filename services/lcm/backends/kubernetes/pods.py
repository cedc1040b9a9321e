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
- A learner pod has two containers (docs/KUBERNETES.md): `controller` runs
  the injected entrypoint (`entry.py`) under uid 1001 with the job's
  credentials; `learner` runs the waiter (frameworks/podwaiter.py) under uid 1000 with
  none and no Secret. They share the workdir and the hand-off emptyDirs, not
  a PID namespace. The controller's share of the manifest's CPU and memory
  (100m and 256Mi, at most half) is taken out of the learner's.
- Every pod follows the `restricted` profile (non-root, no privilege
  escalation, no capabilities, RuntimeDefault seccomp, read-only root
  filesystem with emptyDirs for the workdir and /tmp) and mounts no service
  account token. Credentials come from Secrets, into the controller's and
  the monitor's env only: the platform's object-store keys (unless the
  grant withholds them), the attempt's credentials Secret (the grant) and
  the attempt's env Secret (the team secrets its manifest names).
"""

from __future__ import annotations

import base64

from trainforge_frameworks.torch.launch import elastic_env, elastic_restarts
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.lcm.backends.base import AttemptPlan, Role
from trainforge_services.lcm.backends.kubernetes import naming

# what the injected entrypoint reads: the spec as JSON, and each team secret as TF_SECRET__<VAR>
from trainforge_services.lcm.backends.kubernetes.entry import (
    ATTEMPT_DIR_ENV,
    HANDOFF_ENV,
    SECRET_PREFIX,
    SPEC_ENV,
)
from trainforge_services.lcm.backends.kubernetes.naming import (
    CONTAINER,
    CONTROLLER_CONTAINER,
    GPU_RESOURCE,
    HANDOFF_PATH,
    LEARNER_CONTAINER,
    RANK,
    ROLE,
    KubeOptions,
    attempt_labels,
    attempt_name,
    credentials_name,
    learner_name,
    monitor_name,
    namespace,
    secret_name,
)
from trainforge_services.lcm.backends.kubernetes.team import (
    MONITOR_CPU_MILLI,
    MONITOR_MEMORY,
    gpu_class,
    job_policy,
)

ENTRY_MODULE = "trainforge_services.lcm.backends.kubernetes.entry"
WAITER_MODULE = "trainforge_frameworks.podwaiter"
PLAN_KEY = "plan.json"
# the learner's uid and the pod's group; the controller's uid (in that group)
RUN_AS = 1000
CONTROLLER_UID = 1001
# the controller container's share of a learner pod's CPU and memory: this much, at most half of it
CONTROLLER_CPU_MILLI = 100
CONTROLLER_MEMORY = 256 * 2**20
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


def _security(uid: int = RUN_AS) -> tuple[dict, dict]:
    pod = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
           "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                 "readOnlyRootFilesystem": True, "runAsNonRoot": True}
    if uid != RUN_AS:
        container["runAsUser"] = uid
    return pod, container


def _plain(env: dict[str, str]) -> list[dict]:
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def _platform_env(plan: AttemptPlan, opts: KubeOptions, role: Role) -> list[dict]:
    """The role's settings less what the grant withholds or sets itself; then the grant's own variables, from
    the attempt's credentials Secret."""
    grant = plan.grant
    own = grant.monitor if role is Role.MONITOR else grant.controller
    env = {**opts.platform_env, "TF_STACK_ID": opts.stack, "TF_STATE_DIR": str(plan.attempt_dir),
           "TF_ISOLATION": "none", "HOME": "/tmp", ATTEMPT_DIR_ENV: str(plan.attempt_dir)}
    if opts.pythonpath:
        env["PYTHONPATH"] = opts.pythonpath
    out = _plain({k: v for k, v in env.items() if k not in grant.withheld and k not in own})
    if role is Role.CONTROLLER:
        out += [{"name": key, "valueFrom": {"secretKeyRef": {"name": opts.platform_secret, "key": key,
                                                              "optional": True}}}
                for key in naming.PLATFORM_SECRET_KEYS if key not in grant.withheld and key not in own]
    out += [{"name": var, "valueFrom": {"secretKeyRef": {"name": credentials_name(plan.job_id, plan.attempt),
                                                          "key": f"{role.value}.{var}"}}}
            for var in sorted(own)]
    return out


def _container(name: str, image: str, opts: KubeOptions, command: list[str], env: list[dict], resources: dict,
               uid: int, mounts: dict[str, str]) -> dict:
    return {"name": name, "image": image, "imagePullPolicy": opts.pull_policy, "command": command, "env": env,
            "resources": resources, "securityContext": _security(uid)[1],
            "volumeMounts": [{"name": k, "mountPath": v} for k, v in mounts.items()]}


def _pod(plan: AttemptPlan, opts: KubeOptions, name: str, owner: dict, *, role: str, containers: list[dict],
         volumes: list[str], extra_labels: dict[str, str] | None = None, spec_extra: dict | None = None) -> dict:
    spec = {"restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
            "securityContext": _security()[0], "containers": containers,
            "volumes": [{"name": v, "emptyDir": {}} for v in volumes], **(spec_extra or {})}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(plan, opts, name, owner, **{ROLE: role, **(extra_labels or {})}), "spec": spec}


def monitor_pod(plan: AttemptPlan, opts: KubeOptions, owner: dict) -> dict:
    quantity = {"cpu": f"{MONITOR_CPU_MILLI}m", "memory": str(MONITOR_MEMORY)}
    env = [*_platform_env(plan, opts, Role.MONITOR), {"name": SPEC_ENV, "value": plan.monitor.to_json()}]
    main = _container(CONTAINER, opts.platform_image, opts, [opts.python, "-m", ENTRY_MODULE, ROLE_MONITOR], env,
                      {"requests": quantity, "limits": quantity}, RUN_AS, {"work": opts.workdir, "tmp": "/tmp"})
    return _pod(plan, opts, monitor_name(plan.job_id, plan.attempt), owner, role=ROLE_MONITOR, containers=[main],
                volumes=["work", "tmp"])


def _shares(plan: AttemptPlan) -> tuple[dict, dict]:
    """The manifest's CPU and memory split into the controller's share and the learner's (requests = limits)."""
    res = plan.manifest.resources
    cpu_milli, memory = round(res.cpus * 1000), int(res.memory)
    controller_cpu, controller_memory = min(CONTROLLER_CPU_MILLI, cpu_milli // 2), min(CONTROLLER_MEMORY, memory // 2)
    controller = {"cpu": f"{controller_cpu}m", "memory": str(controller_memory)}
    learner = {"cpu": f"{cpu_milli - controller_cpu}m", "memory": str(memory - controller_memory)}
    if res.gpus:
        learner[GPU_RESOURCE] = str(res.gpus)
    return controller, learner


def learner_pod(plan: AttemptPlan, opts: KubeOptions, spec: LearnerSpec, owner: dict) -> dict:
    res = plan.manifest.resources
    extra: dict = {"hostname": learner_name(plan.job_id, plan.attempt, spec.rank),
                   "subdomain": attempt_name(plan.job_id, plan.attempt), "shareProcessNamespace": False}
    if res.gpus:
        if opts.gpu_tolerations:
            extra["tolerations"] = [dict(t) for t in opts.gpu_tolerations]
        if res.gpu_type:
            extra["nodeSelector"] = dict(opts.gpu_node_selectors.get(res.gpu_type)
                                         or {opts.gpu_type_label: res.gpu_type})
            extra["priorityClassName"] = gpu_class(res.gpu_type)
    ddp = rendezvous_env(plan, spec)
    env = [*_platform_env(plan, opts, Role.CONTROLLER), *_plain(ddp),
           {"name": SPEC_ENV, "value": pod_spec_of(spec).to_json()}, {"name": HANDOFF_ENV, "value": HANDOFF_PATH}]
    env += [{"name": f"{SECRET_PREFIX}{var}",
             "valueFrom": {"secretKeyRef": {"name": secret_name(plan.job_id, plan.attempt), "key": var}}}
            for var in sorted(plan.manifest.secret_env())]
    image = plan.manifest.image or opts.image
    controller_share, learner_share = _shares(plan)
    controller = _container(CONTROLLER_CONTAINER, image, opts, [opts.python, "-m", ENTRY_MODULE, ROLE_LEARNER], env,
                            {"requests": controller_share, "limits": controller_share}, CONTROLLER_UID,
                            {"work": opts.workdir, "handoff": HANDOFF_PATH, "tmp": "/tmp"})
    # the learner's own env comes from the controller through the hand-off; the waiter needs only these
    waiter_env = {"HOME": "/tmp", **({"PYTHONPATH": opts.pythonpath} if opts.pythonpath else {})}
    learner = _container(LEARNER_CONTAINER, image, opts, [opts.python, "-m", WAITER_MODULE, HANDOFF_PATH],
                         _plain(waiter_env), {"requests": learner_share, "limits": learner_share}, RUN_AS,
                         {"work": opts.workdir, "handoff": HANDOFF_PATH, "learner-tmp": "/tmp"})
    return _pod(plan, opts, learner_name(plan.job_id, plan.attempt, spec.rank), owner, role=ROLE_LEARNER,
                containers=[controller, learner], volumes=["work", "handoff", "tmp", "learner-tmp"],
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


def credentials_secret(plan: AttemptPlan, opts: KubeOptions, owner: dict) -> dict | None:
    """The job's own credentials (the lifecycle's grant), as `<role>.<VAR>` keys (None when it sets none)."""
    data = {f"{role.value}.{var}": base64.b64encode(value.encode()).decode()
            for role, env in ((Role.CONTROLLER, plan.grant.controller), (Role.MONITOR, plan.grant.monitor))
            for var, value in sorted(env.items())}
    if not data:
        return None
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(plan, opts, credentials_name(plan.job_id, plan.attempt), owner), "data": data}


def attempt_objects(plan: AttemptPlan, opts: KubeOptions, owner: dict) -> list[dict]:
    """What the root owns, in creation order: Secrets, Service, NetworkPolicy, the monitor, the learners."""
    policy = job_policy(opts, plan.team, plan.job_id, attempt_name(plan.job_id, plan.attempt))
    policy["metadata"]["labels"] = attempt_labels(opts, plan.team, plan.job_id, plan.attempt)
    policy["metadata"]["ownerReferences"] = [owner]
    out = [o for o in (credentials_secret(plan, opts, owner), env_secret(plan, opts, owner)) if o is not None]
    out += [rendezvous_service(plan, opts, owner), policy, monitor_pod(plan, opts, owner)]
    out += [learner_pod(plan, opts, spec, owner) for spec in plan.learners]
    return out

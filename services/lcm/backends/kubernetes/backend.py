"""The kubernetes backend: an attempt is a root ConfigMap and the pods, Service and policy it owns.

- `launch` makes sure the team's namespace and its standing objects exist
  (`ensure_team`), the PriorityClass of a GPU type the plan asks for, then
  creates the root (`pods.root_object`) and, with an owner reference to it,
  everything else (`pods.attempt_objects`): monitor first, then learners. A
  ResourceQuota refusing a pod comes back as `ResourceExhausted` carrying the
  quota's own message; the lifecycle then stops what was created and the
  Trainer fails the deploy with those words.
- `stop` deletes every root carrying the job's labels (the garbage collector
  removes what each owns, the attempt's credentials Secret too), then, as a
  fallback for anything an owner reference missed, every pod, Service,
  Secret and NetworkPolicy with the job's labels.
- `observe` lists the attempt's pods by label: a learner pod is a
  controller handle, the monitor pod the monitor handle; `status.pod_state`
  turns phases and container states into alive + the cluster's reason. The
  monitor delivered its last state when its pod Succeeded (its entrypoint
  exits 0 only then).
- `recover` reads the attempts' root ConfigMaps back into plans, so an LCM
  that lost its state directory still adopts what runs (by label).
- `capacity` sums the allocatable resources of the schedulable nodes, and
  says whether the cluster enforces NetworkPolicies as the canary last saw
  it (`canary.py`; started with the backend unless `kube_netpol_canary` is 0).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path

from trainforge_services.common.adapters.kube import Kube
from trainforge_services.common.errors import Conflict, InvalidArgument, TrainforgeError
from trainforge_services.common.retry import QUICK
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.backends.base import (
    AttemptPlan,
    Backend,
    Capacity,
    Handle,
    JobView,
    Observed,
    Role,
    Site,
)
from trainforge_services.lcm.backends.kubernetes import naming, pods, team
from trainforge_services.lcm.backends.kubernetes.canary import NetpolCanary
from trainforge_services.lcm.backends.kubernetes.naming import KubeOptions
from trainforge_services.lcm.backends.kubernetes.status import pod_state, quantity

log = logging.getLogger(__name__)

_ATTEMPT_KINDS = ("Pod", "Service", "Secret", "NetworkPolicy", "ConfigMap")
# How long a pod replacing a deleted one waits for the old one's name to be free.
REPLACE_SECONDS = 30.0


class KubernetesBackend(Backend):
    name = "kubernetes"

    def __init__(self, settings: LcmSettings, *, kube: Kube | None = None):
        self._settings = settings
        self._kube = kube or Kube(settings.kube_config, settings.kube_context)
        self.opts = KubeOptions.from_settings(settings, os.environ.get("TF_STACK_ID") or "default")
        self._credentials = {"TF_S3_ACCESS_KEY": settings.s3_access_key, "TF_S3_SECRET_KEY": settings.s3_secret_key}
        self.canary: NetpolCanary | None = None
        if settings.kube_netpol_canary > 0:
            self.canary = NetpolCanary(self._kube, self.opts, max_age=settings.kube_netpol_canary)
            self.canary.start()

    @property
    def kube(self) -> Kube:
        return self._kube

    # -- teams ------------------------------------------------------------------------

    def ensure_team(self, team_name: str, quota: team.TeamQuota | None = None) -> str:
        """Create or update the team's namespace, LimitRange, policies, platform Secret (and quota if given)."""
        for obj in team.team_objects(self.opts, team_name, quota, self._credentials):
            self._kube.apply(obj)
        return naming.namespace(self.opts, team_name)

    def sync_team(self, team_name: str, quota: team.TeamQuota) -> str:
        """Bring the team's ResourceQuotas in step with `quota` (an admin changed it): per-type quotas of types
        no longer limited are removed."""
        ns = self.ensure_team(team_name, quota)
        wanted = {o["metadata"]["name"] for o in team.quota_objects(self.opts, team_name, quota)}
        for existing in self._kube.list("ResourceQuota", ns, self._team_selector(team_name)):
            if existing["metadata"]["name"] not in wanted:
                self._kube.delete("ResourceQuota", ns, existing["metadata"]["name"])
        return ns

    def mirror_quota(self, team_name: str, quota: team.TeamQuota) -> bool:
        self.sync_team(team_name, quota)
        return True

    def _team_selector(self, team_name: str) -> str:
        return ",".join(f"{k}={v}" for k, v in naming.team_labels(self.opts, team_name).items())

    # -- Backend --------------------------------------------------------------------

    def site(self, job_id: str, attempt: int) -> Site:
        s = self._settings
        port = naming.master_port(job_id, attempt, s.kube_master_port, s.kube_master_port_span)
        addr = s.kube_master_addr or \
            f"{naming.learner_name(job_id, attempt, 0)}.{naming.attempt_name(job_id, attempt)}"
        return Site(attempt_dir=Path(s.kube_workdir) / job_id / str(attempt), master_addr=addr, master_port=port)

    def launch(self, plan: AttemptPlan) -> list[Handle]:
        # the quota the Trainer sent with the deploy: the namespace's quotas follow an admin's change
        if plan.team_quota is not None:
            self.sync_team(plan.team, plan.team_quota)
        else:
            self.ensure_team(plan.team)
        res = plan.manifest.resources
        if res.gpus and res.gpu_type:
            self._kube.apply(team.priority_class(self.opts, res.gpu_type))
        root = self._root(plan)
        for obj in pods.attempt_objects(plan, self.opts, pods.owner_reference(root)):
            try:
                self._kube.create(obj)
            except Conflict:
                pass  # made by an earlier launch of this attempt that was cut short
        return self.observe(plan).handles

    def _root(self, plan: AttemptPlan) -> dict:
        obj = pods.root_object(plan, self.opts)
        try:
            return self._kube.create(obj)
        except Conflict:
            current = self._kube.get("ConfigMap", obj["metadata"]["namespace"], obj["metadata"]["name"])
            if current is None:
                return self._kube.create(obj)
            return current

    def stop(self, job_id: str) -> int:
        selector = naming.job_selector(self.opts, job_id)
        now = dt.datetime.now(dt.UTC)
        found = self._kube.list("Pod", None, selector)
        running = sum(1 for p in found if not p["metadata"].get("deletionTimestamp")
                      and pod_state(p, now, self._settings.kube_pending_timeout).alive)
        namespaces = {p["metadata"]["namespace"] for p in found}
        for root in self._kube.list("ConfigMap", None, selector):
            namespaces.add(root["metadata"]["namespace"])
            self._kube.delete("ConfigMap", root["metadata"]["namespace"], root["metadata"]["name"])
        for ns in sorted(namespaces):
            for kind in _ATTEMPT_KINDS:
                self._kube.delete_all(kind, ns, selector)
        return running

    def _pods(self, plan: AttemptPlan) -> list[dict]:
        selector = f"{naming.job_selector(self.opts, plan.job_id)},{naming.ATTEMPT}={plan.attempt}"
        return self._kube.list("Pod", naming.namespace(self.opts, plan.team), selector)

    def observe(self, plan: AttemptPlan) -> JobView:
        now = dt.datetime.now(dt.UTC)
        observed, done = [], False
        for pod in sorted(self._pods(plan), key=lambda p: p["metadata"]["name"]):
            labels = pod["metadata"].get("labels", {})
            state = pod_state(pod, now, self._settings.kube_pending_timeout)
            alive = state.alive and not pod["metadata"].get("deletionTimestamp")
            name = pod["metadata"]["name"]
            if labels.get(naming.ROLE) == pods.ROLE_MONITOR:
                done = done or state.succeeded
                observed.append(Observed(Handle(Role.MONITOR, name), alive, state.reason))
            elif labels.get(naming.RANK, "").isdigit():
                rank = int(labels[naming.RANK])
                observed.append(Observed(Handle(Role.CONTROLLER, name, rank), alive, state.reason))
        return JobView(job_id=plan.job_id, processes=tuple(observed), monitor_done=done)

    def restart_monitor(self, plan: AttemptPlan) -> Handle:
        ns = naming.namespace(self.opts, plan.team)
        name = naming.monitor_name(plan.job_id, plan.attempt)
        root = self._kube.get("ConfigMap", ns, naming.attempt_name(plan.job_id, plan.attempt))
        if root is None:
            raise InvalidArgument(f"job {plan.job_id} attempt {plan.attempt} has no root ConfigMap to own its "
                                  "monitor", details=[{"field": "job_id", "message": "attempt not launched"}])
        self._apply_credentials(plan, root)
        self._kube.delete("Pod", ns, name, grace=0)
        self._create_in_place(pods.monitor_pod(plan, self.opts, pods.owner_reference(root)))
        return Handle(Role.MONITOR, name)

    def _apply_credentials(self, plan: AttemptPlan, root: dict) -> None:
        """The attempt's credentials Secret as the plan's grant says (an LCM that restarted minted it again)."""
        secret = pods.credentials_secret(plan, self.opts, pods.owner_reference(root))
        if secret is not None:
            self._kube.apply(secret)

    def launch_learners(self, plan: AttemptPlan, ranks: list[int]) -> list[Handle]:
        """Pods for `ranks` of a running attempt (an elastic job grows or fills a lost learner's slot): a slot's
        old pod is deleted first. The root's plan.json keeps the plan the attempt started with."""
        ns = naming.namespace(self.opts, plan.team)
        root = self._kube.get("ConfigMap", ns, naming.attempt_name(plan.job_id, plan.attempt))
        if root is None:
            raise InvalidArgument(f"job {plan.job_id} attempt {plan.attempt} has no root ConfigMap to own its "
                                  "learners", details=[{"field": "job_id", "message": "attempt not launched"}])
        self._apply_credentials(plan, root)
        handles = []
        for rank in ranks:
            pod = pods.learner_pod(plan, self.opts, plan.learners[rank], pods.owner_reference(root))
            name = pod["metadata"]["name"]
            self._kube.delete("Pod", ns, name, grace=0)
            self._create_in_place(pod)
            handles.append(Handle(Role.CONTROLLER, name, rank))
        return handles

    def _create_in_place(self, pod: dict) -> None:
        """Create `pod` under the name of one just deleted: the name is free once the API server finished deleting
        the old pod."""
        QUICK.within(deadline=REPLACE_SECONDS).call(lambda: self._kube.create(pod), retry_on=Conflict)

    def recover(self) -> list[AttemptPlan]:
        """Plans rebuilt from the roots of this stack's attempts (adoption by label after losing the records)."""
        selector = f"{naming.MANAGED_BY}={naming.MANAGER},{naming.STACK}={naming.label_value(self.opts.stack)}," \
                   f"{naming.JOB}"
        plans = []
        for root in self._kube.list("ConfigMap", None, selector):
            try:
                plans.append(plan_from_root(root))
            except TrainforgeError as e:
                log.warning("cannot adopt %s/%s: %s", root["metadata"]["namespace"], root["metadata"]["name"],
                            e.message)
        return sorted(plans, key=lambda p: -p.attempt)  # the newest attempt of a job wins

    def capacity(self) -> Capacity:
        cpus = memory = gpus = pods_ = 0.0
        for node in self._kube.list("Node"):
            if node.get("spec", {}).get("unschedulable"):
                continue
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in node.get("status", {}).get("conditions") or [])
            if not ready:
                continue
            alloc = node.get("status", {}).get("allocatable") or {}
            cpus += quantity(alloc.get("cpu", "0"))
            memory += quantity(alloc.get("memory", "0"))
            gpus += quantity(alloc.get(naming.GPU_RESOURCE, "0"))
            pods_ += quantity(alloc.get("pods", "0"))
        return Capacity(backend=self.name, gpus=int(gpus), cpus=cpus, memory=int(memory),
                        max_learners=min(int(pods_), self._settings.local_max_learners),
                        network_policy=self.canary.verdict().line if self.canary else "not checked (no canary)")

    def close(self) -> None:
        try:
            self._kube.close()
        except TrainforgeError:
            pass


def plan_from_root(root: dict) -> AttemptPlan:
    """The attempt plan its root ConfigMap holds (without secret values, which no record keeps: the Trainer
    resends them with every deploy)."""
    name = f"{root['metadata'].get('namespace')}/{root['metadata'].get('name')}"
    raw = (root.get("data") or {}).get(pods.PLAN_KEY)
    if not raw:
        raise InvalidArgument(f"{name} has no {pods.PLAN_KEY}", details=[{"field": pods.PLAN_KEY, "message": "missing"}])
    try:
        return AttemptPlan.model_validate_json(raw)
    except ValueError as e:
        raise InvalidArgument(f"{name} {pods.PLAN_KEY} is not a plan: {e}",
                              details=[{"field": pods.PLAN_KEY, "message": "invalid"}]) from None

"""The test node: a Node object, a one-node scheduler and the kubelet's pod loop, against the real API.

`TestNode.run()` registers (or refreshes) its Node with capacity and
allocatable (cpu, memory, pods, optionally nvidia.com/gpu), labels, taints
and a Ready condition, then lists and watches every pod:
- a pod with no nodeName and the default scheduler is bound to this node
  through the Binding subresource when it fits (tests/kubenode/fit.py);
  otherwise its PodScheduled condition becomes False, reason Unschedulable,
  with the scheduler's message. Unschedulable pods are tried again when a
  pod of this node ends or goes;
- a pod bound to this node gets a `PodWorker` (tests/kubenode/pod.py);
- a pod of this node with a deletionTimestamp has its processes stopped
  (SIGTERM, its grace period, SIGKILL) and is then deleted with grace 0,
  which is how the kubelet lets the apiserver remove it.
On SIGTERM the node stops its pods' processes (a 2 s grace) and marks them
Failed, reason Shutdown; a node killed outright leaves them to the fixture.
"""

from __future__ import annotations

import logging
import threading
from decimal import Decimal
from pathlib import Path

import httpx

from tests.kubenode import fit
from tests.kubenode.containers import POD_IP
from tests.kubenode.pod import PodWorker, now
from tests.kubenode.rest import MERGE, ApiError, Kube, WatchExpired
from trainforge_services.common.retry import Backoff

log = logging.getLogger("kubenode")
TERMINAL = ("Succeeded", "Failed")


class TestNode:
    __test__ = False  # not a pytest test class

    def __init__(self, kube: Kube, name: str, allocatable: dict[str, str], labels: dict[str, str],
                 taints: list[dict], workdir: Path, base_env: dict[str, str], schedule: bool = True):
        self.kube, self.name, self.workdir, self.base_env = kube, name, workdir, base_env
        self.allocatable_text = allocatable
        self.allocatable = {k: fit.quantity(v) for k, v in allocatable.items()}
        self.labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}
        self.taints, self.schedule_pods = taints, schedule
        self.pgid_file = workdir / "pgids"
        self.workers: dict[str, PodWorker] = {}
        self.mine: dict[str, dict] = {}  # uid -> the latest pod bound here
        self.unscheduled: dict[str, dict] = {}  # uid -> pending pods this node could not take
        self.reported: dict[str, str] = {}  # uid -> the Unschedulable message last written
        self.deleting: set[str] = set()
        self.stop_event = threading.Event()

    # -- the Node object ----------------------------------------------------------------------------------
    def register(self) -> None:
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": self.labels},
                "spec": {"taints": self.taints} if self.taints else {}}
        try:
            self.kube.post("/api/v1/nodes", body)
        except ApiError as e:
            if e.status != 409:
                raise
            self.kube.patch(f"/api/v1/nodes/{self.name}", {"metadata": {"labels": self.labels},
                                                            "spec": {"taints": self.taints or None}}, MERGE)
        t = now()
        self.kube.patch(f"/api/v1/nodes/{self.name}/status", {"status": {
            "capacity": self.allocatable_text, "allocatable": self.allocatable_text,
            "addresses": [{"type": "InternalIP", "address": POD_IP}, {"type": "Hostname", "address": self.name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "TestNodeReady",
                            "message": "the test node runs bound pods as local processes",
                            "lastHeartbeatTime": t, "lastTransitionTime": t}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "testnode",
                         "kubeProxyVersion": "", "containerRuntimeVersion": "testnode://local-processes",
                         "bootID": "", "kernelVersion": "", "machineID": "", "osImage": "", "systemUUID": ""}}},
            MERGE)

    # -- scheduling ---------------------------------------------------------------------------------------
    def _used(self) -> dict[str, Decimal]:
        used: dict[str, Decimal] = {}
        for pod in self.mine.values():
            if pod.get("status", {}).get("phase") not in TERMINAL:
                used = fit.add(used, fit.pod_requests(pod))
        return used

    def schedule(self, pod: dict) -> None:
        meta = pod["metadata"]
        reasons = fit.unfit_reasons(pod, self.allocatable, self._used(), self.labels, self.taints)
        if not reasons:
            try:
                self.kube.post(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", {
                    "apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.name}})
            except ApiError as e:
                if e.status not in (404, 409):  # gone, or bound by someone else meanwhile
                    raise
                return
            self.unscheduled.pop(meta["uid"], None)
            self.mine[meta["uid"]] = {**pod, "spec": {**pod["spec"], "nodeName": self.name}}
            return
        self.unscheduled[meta["uid"]] = pod
        message = fit.unschedulable_message(reasons)
        if self.reported.get(meta["uid"]) == message:
            return
        self.reported[meta["uid"]] = message
        try:
            self.kube.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status", {"status": {
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                "message": message, "lastProbeTime": None, "lastTransitionTime": now()}]}})
        except ApiError as e:
            if e.status != 404:
                raise

    def _retry_unscheduled(self) -> None:
        for pod in list(self.unscheduled.values()):
            self.schedule(pod)

    # -- pods of this node --------------------------------------------------------------------------------
    def _delete(self, pod: dict) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        if uid in self.deleting:
            return
        self.deleting.add(uid)
        grace = float(meta.get("deletionGracePeriodSeconds") or 0)

        def finish() -> None:
            worker = self.workers.pop(uid, None)
            if worker is not None:
                worker.stop(grace)
            try:
                self.kube.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                 {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                                  "preconditions": {"uid": uid}})
            except ApiError as e:
                if e.status not in (404, 409):
                    log.warning("deleting %s/%s: %s", meta["namespace"], meta["name"], e)

        threading.Thread(target=finish, name=f"delete-{meta['name']}", daemon=True).start()

    def handle(self, kind: str, pod: dict) -> None:
        if self.stop_event.is_set():
            return
        meta, spec = pod["metadata"], pod.get("spec", {})
        uid = meta["uid"]
        if kind == "DELETED":
            for table in (self.mine, self.unscheduled, self.reported):
                table.pop(uid, None)
            worker = self.workers.pop(uid, None)
            if worker is not None:  # removed without a graceful deletion reaching us (grace 0 by someone else)
                threading.Thread(target=worker.stop, args=(0,), daemon=True).start()
            self.deleting.discard(uid)
            self._retry_unscheduled()
            return
        node = spec.get("nodeName")
        if node == self.name:
            was_running = self.mine.get(uid, {}).get("status", {}).get("phase") not in TERMINAL
            self.mine[uid] = pod
            if meta.get("deletionTimestamp"):
                self._delete(pod)
            elif uid not in self.workers and pod.get("status", {}).get("phase") not in TERMINAL:
                self.workers[uid] = PodWorker(self.kube, pod, self.workdir, self.base_env, self.pgid_file)
                self.workers[uid].start()
            if was_running and pod.get("status", {}).get("phase") in TERMINAL:
                self._retry_unscheduled()
        elif not node and self.schedule_pods and not meta.get("deletionTimestamp") \
                and spec.get("schedulerName", "default-scheduler") == "default-scheduler":
            self.schedule(pod)

    # -- the loop -----------------------------------------------------------------------------------------
    def run(self) -> None:
        self.register()
        log.info("test node %s registered (%s)", self.name, self.allocatable_text)
        backoff = Backoff(initial=0.2, maximum=5.0)
        while not self.stop_event.is_set():
            try:
                listing = self.kube.get("/api/v1/pods")
                for pod in listing["items"]:
                    self.handle("ADDED", pod)
                rv = listing["metadata"]["resourceVersion"]
                backoff.reset()
                while not self.stop_event.is_set():
                    for kind, obj in self.kube.watch("/api/v1/pods", rv, timeout_seconds=30):
                        rv = obj["metadata"]["resourceVersion"]
                        if kind != "BOOKMARK":
                            self.handle(kind, obj)
                        if self.stop_event.is_set():
                            break
            except WatchExpired:
                continue
            except (httpx.HTTPError, ApiError) as e:
                # an apiserver restart or a dropped watch: list again, as an informer does
                log.warning("pod watch: %s; listing again", e)
                self.stop_event.wait(backoff.next())

    def shutdown(self, grace: float = 2.0) -> None:
        """Stop every pod's processes and mark the pods Failed, reason Shutdown (the node's SIGTERM)."""
        self.stop_event.set()
        for uid, worker in list(self.workers.items()):
            worker.stop(grace)
            self.workers.pop(uid, None)
            try:
                self.kube.patch(worker.path + "/status", {"status": {
                    "phase": "Failed", "reason": "Shutdown", "message": "the test node stopped"}}, MERGE)
            except ApiError as e:
                log.warning("marking %s Failed: %s", worker.path, e)

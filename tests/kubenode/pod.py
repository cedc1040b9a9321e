"""One bound pod on the test node: its containers as local processes, its status through the API.

A `PodWorker` thread prepares the pod's directory and volumes, runs the
init containers one after another, then starts every container at once
(each in a process group of its own, output to
`<workdir>/pods/<namespace>_<name>_<uid>/<container>.log`) and keeps the
pod's status the kubelet's way: phase Pending, Running, then Succeeded
(every container exited 0) or Failed, with per-container states (waiting
ContainerCreating/CreateContainerConfigError, running, terminated with the
exit code and reason Completed or Error), restart counts and the
PodScheduled/Initialized/ContainersReady/Ready conditions. restartPolicy
Always and OnFailure restart a container after a backoff. Images are
recorded in the status, never pulled; resource limits and security contexts
are not enforced (a process runs as the node's user).

`stop(grace)` is the kubelet's half of a deletion: SIGTERM to every
container's process group, SIGKILL after the grace period. The node's log
has a line for each pod that ended by itself (phase, each container's exit
code) and for each container a deletion stopped.
"""

from __future__ import annotations

import datetime
import logging
import os
import subprocess
import threading
from pathlib import Path

import psutil

from tests.kubenode.containers import POD_IP, ConfigError, Resolver, make_volumes, process_spec
from tests.kubenode.rest import MERGE, ApiError, Kube
from trainforge_services.common import proctree
from trainforge_services.common.retry import Backoff

_POLL = 0.1
log = logging.getLogger(__name__)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _exit_reason(code: int) -> str:
    return "Completed" if code == 0 else "Error"


class Container:
    """One container's process and its status entry."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.name = spec["name"]
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.state: dict = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict = {}
        self.done = False  # terminated for good (no restart will follow)

    def status(self) -> dict:
        running = "running" in self.state
        return {"name": self.name, "image": self.spec.get("image", ""), "imageID": "",
                "containerID": f"testnode://{self.proc.pid}" if self.proc else "", "ready": running,
                "started": running, "restartCount": self.restarts, "state": self.state,
                "lastState": self.last_state}


class PodWorker(threading.Thread):
    def __init__(self, kube: Kube, pod: dict, workdir: Path, base_env: dict[str, str], pgid_file: Path):
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.kube, self.pod, self.base_env, self.pgid_file = kube, pod, base_env, pgid_file
        self.path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        self.dir = workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        self.stopping = threading.Event()
        self.init = [Container(c) for c in pod["spec"].get("initContainers") or []]
        self.main = [Container(c) for c in pod["spec"]["containers"]]
        self.policy = pod["spec"].get("restartPolicy", "Always")
        self.start_time = now()
        self.final_phase: str | None = None  # Succeeded or Failed once the pod is done
        self.initialized = not self.init
        self.message: dict = {}
        self._lock = threading.Lock()
        self._logged = False  # its end is in the node's log

    # -- status -------------------------------------------------------------------------------------------
    def report(self) -> None:
        """The whole status as a JSON merge patch (lists are replaced, so each report is complete)."""
        ready = self.final_phase is None and all("running" in c.state for c in self.main)
        t = now()
        phase = self.final_phase or ("Running" if self.initialized and any(
            "waiting" not in c.state for c in self.main) else "Pending")

        def cond(kind: str, ok: bool, reason: str | None = None) -> dict:
            c = {"type": kind, "status": "True" if ok else "False", "lastProbeTime": None,
                 "lastTransitionTime": t}
            if reason and not ok:
                c["reason"] = reason
            return c

        status = {"phase": phase, "hostIP": POD_IP, "podIP": POD_IP, "podIPs": [{"ip": POD_IP}],
                  "startTime": self.start_time, "qosClass": self.pod.get("status", {}).get("qosClass", "BestEffort"),
                  "conditions": [cond("PodScheduled", True), cond("Initialized", self.initialized,
                                                                    "ContainersNotInitialized"),
                                 cond("ContainersReady", ready, "ContainersNotReady"),
                                 cond("Ready", ready, "ContainersNotReady")],
                  "initContainerStatuses": [c.status() for c in self.init],
                  "containerStatuses": [c.status() for c in self.main], **self.message}
        if self.stopping.is_set():
            return
        try:
            self.kube.patch(self.path + "/status", {"status": status}, MERGE)
        except ApiError as e:
            if e.status != 404:  # a pod deleted under us needs no status
                raise

    # -- processes ----------------------------------------------------------------------------------------
    def _start(self, c: Container, volumes: dict[str, Path], resolver: Resolver) -> bool:
        """Start c's process; False (and a CreateContainerConfigError state) when its config cannot be made."""
        try:
            argv, env, cwd = process_spec(self.pod, c.spec, self.base_env, resolver, volumes, self.dir)
        except ConfigError as e:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            return False
        with open(self.dir / f"{c.name}.log", "ab") as log:
            try:
                c.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                c.proc = None
                c.state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": str(e),
                                          "startedAt": now(), "finishedAt": now()}}
                return True
        with open(self.pgid_file, "a") as f:
            f.write(f"{c.proc.pid}\n")
        c.state = {"running": {"startedAt": now()}}
        return True

    def _finished(self, c: Container) -> bool:
        """True when c's process has exited; records the terminated state."""
        if c.proc is None:
            return "terminated" in c.state
        code = c.proc.poll()
        if code is None:
            return False
        started = c.state.get("running", {}).get("startedAt", now())
        code = 128 - code if code < 0 else code  # a signal N is reported as 128+N, like a container runtime
        c.state = {"terminated": {"exitCode": code, "reason": _exit_reason(code), "startedAt": started,
                                  "finishedAt": now(), "containerID": f"testnode://{c.proc.pid}"}}
        return True

    def _restart_due(self, c: Container) -> bool:
        code = c.state["terminated"]["exitCode"]
        if c in self.init:  # an init container is retried only after a failure, unless the policy is Never
            return code != 0 and self.policy != "Never"
        return self.policy == "Always" or (self.policy == "OnFailure" and code != 0)

    def _wait_all(self, containers: list[Container], volumes: dict[str, Path], resolver: Resolver) -> bool:
        """Run containers until each is done for good; False when stopped."""
        backoffs = {c.name: Backoff(initial=1.0, maximum=10.0) for c in containers}
        pending = {c.name: c for c in containers}
        while pending and not self.stopping.is_set():
            changed = False
            for c in list(pending.values()):
                if "waiting" in c.state:
                    if not self._start(c, volumes, resolver):
                        self.report()  # CreateContainerConfigError, then a retry after the backoff
                        if self.stopping.wait(backoffs[c.name].next()):
                            return False
                    changed = True
                elif self._finished(c):
                    changed = True
                    if self._restart_due(c):
                        c.last_state, c.restarts = c.state, c.restarts + 1
                        if self.stopping.wait(backoffs[c.name].next()):
                            return False
                        self._start(c, volumes, resolver)
                    else:
                        c.done = True
                        del pending[c.name]
            if changed:
                self.report()
            self.stopping.wait(_POLL)
        return not self.stopping.is_set()

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - the pod must say why the node gave up on it
            self.final_phase = "Failed"
            self.message = {"reason": "TestNodeError", "message": f"{type(e).__name__}: {e}"}
            self.report()

    def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        resolver = Resolver(self.kube, self.pod["metadata"]["namespace"])
        self.report()
        try:
            volumes = make_volumes(self.pod, self.dir, resolver)
        except ConfigError as e:
            self.final_phase, self.message = "Failed", {"reason": "FailedMount", "message": str(e)}
            self.report()
            return
        for c in self.init:
            if not self._wait_all([c], volumes, resolver):
                return
            if c.state["terminated"]["exitCode"] != 0:
                # restartPolicy Never: a failed init container fails the pod (others retried it above)
                self.final_phase = "Failed"
                self.report()
                return
        self.initialized = True
        if not self._wait_all(self.main, volumes, resolver):
            return
        ok = all(c.state["terminated"]["exitCode"] == 0 for c in self.main)
        self.final_phase = "Succeeded" if ok else "Failed"
        self.report()
        self._log_end()

    def _log_end(self) -> None:
        """The node's log says which pods ended by themselves (a deleted pod's status is no longer reported)."""
        with self._lock:
            codes = [c.proc.poll() if c.proc is not None else None for c in self.main]
            if self._logged or any(code is None for code in codes):
                return
            self._logged = True
        codes = [128 - code if code < 0 else code for code in codes]
        log.info("pod %s ended: %s (%s)", self.path.rsplit("/namespaces/", 1)[1],
                 "Succeeded" if not any(codes) else "Failed",
                 ", ".join(f"{c.name} exited {code}" for c, code in zip(self.main, codes, strict=True)))

    def stop(self, grace: float) -> proctree.Stopped:
        """The containers' process groups get SIGTERM, then SIGKILL after `grace` seconds."""
        self.stopping.set()
        self._log_end()  # one that ended by itself just before its deletion
        procs, groups = [], []
        for c in self.init + self.main:
            if c.proc is not None and c.proc.poll() is None:
                log.info("pod %s: stopping container %s", self.path.rsplit("/namespaces/", 1)[1], c.name)
                groups.append(c.proc.pid)
                try:
                    procs.append(psutil.Process(c.proc.pid))
                except psutil.NoSuchProcess:
                    pass
        stopped = proctree.terminate(procs, grace=grace, groups=groups)
        self.join(grace + 10)
        return stopped


def kill_recorded(pgid_file: Path) -> None:
    """SIGKILL every process group the node started (for a node that was itself killed)."""
    try:
        pgids = {int(line) for line in pgid_file.read_text().split()}
    except OSError:
        return
    for pgid in pgids:
        try:
            os.killpg(pgid, 9)
        except (ProcessLookupError, PermissionError):
            pass

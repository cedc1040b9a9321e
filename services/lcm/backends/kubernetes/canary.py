"""Whether this cluster enforces NetworkPolicies, as seen by a canary: never assumed.

Many CNIs ignore NetworkPolicy objects, so a team's default deny may stop
nothing. The canary tries what such a policy forbids and reports what
happened. In a namespace of its own, `<prefix>netpol-canary`, labelled
as a team's is (the `restricted` pod-security profile), it applies:

- `tf-default-deny`: all ingress and egress denied, as in every team's;
- `tf-canary-allow`: the `control` pod may reach the `listener` pod;
- the `listener` pod: accepts TCP connections on a port picked per run;
- once the listener runs, the `control` and `probe` pods, each trying to
  connect to the listener's pod IP for a while; exit 0: connected,
  3: never.

The verdict, `NetpolVerdict.line`:
- the probe connected: "NOT enforced" (what the default deny forbids happened);
- the probe never did and the control did: "enforced";
- anything else (a pod that did not run, the control also stopped, the API
  refused): "unknown (why)".

The pods are deleted afterwards; the namespace and its policies stay for
the next run. `NetpolCanary` runs it in a thread of its own at LCM start
and again when its verdict is asked for and older than `max_age`;
`verdict()` never waits for a run.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass

from trainforge_services.common.adapters.kube import Kube
from trainforge_services.common.errors import message_of
from trainforge_services.lcm.backends.kubernetes.naming import (
    MANAGED_BY,
    MANAGER,
    STACK,
    KubeOptions,
    dns_label,
)

log = logging.getLogger(__name__)

ENFORCED, NOT_ENFORCED, UNKNOWN = "enforced", "NOT enforced", "unknown"
CANARY = "tf.canary"  # label of the canary's pods: listener, control or probe
EXIT_CONNECTED, EXIT_NEVER = 0, 3
RUN_AS = 1000
# seconds: a pod to start and run; the control's and the probe's tries
POD_START_TIMEOUT = 120.0
TRY_SECONDS = 10.0
MAX_AGE = 3600.0

_LISTENER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(64)
while True:
    s.accept()[0].close()
"""
_TRY = """
import socket, sys, time
host, port, end = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    try:
        socket.create_connection((host, port), timeout=2).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.3)
sys.exit(3)
"""


@dataclass(frozen=True)
class NetpolVerdict:
    state: str  # ENFORCED | NOT_ENFORCED | UNKNOWN
    why: str = ""
    at: float = 0.0  # time.time() it was reached (0: no run has ended)

    @property
    def line(self) -> str:
        """"enforced", "NOT enforced" or "unknown (why)"."""
        return f"{self.state} ({self.why})" if self.state == UNKNOWN else self.state


def canary_namespace(opts: KubeOptions) -> str:
    return dns_label(f"{opts.namespace_prefix}netpol-canary")


def _labels(opts: KubeOptions, **extra: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, STACK: dns_label(opts.stack), **extra}


def standing_objects(opts: KubeOptions) -> list[dict]:
    """The namespace, its default deny (a team's) and the policy that lets the control reach the listener."""
    ns = canary_namespace(opts)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": _labels(
        opts, **{"pod-security.kubernetes.io/enforce": "restricted"})}}

    def policy(name: str, spec: dict) -> dict:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": ns, "labels": _labels(opts)}, "spec": spec}

    listener, control = ({"podSelector": {"matchLabels": {CANARY: role}}} for role in ("listener", "control"))
    return [namespace,
            policy("tf-default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
            policy("tf-canary-allow-in", {"podSelector": listener["podSelector"], "policyTypes": ["Ingress"],
                                          "ingress": [{"from": [control]}]}),
            policy("tf-canary-allow-out", {"podSelector": control["podSelector"], "policyTypes": ["Egress"],
                                           "egress": [{"to": [listener]}]})]


def canary_pod(opts: KubeOptions, role: str, run: str, args: list[str]) -> dict:
    """One of the canary's pods: the platform image's Python running the listener or a try, as `restricted`."""
    code = _LISTENER if role == "listener" else _TRY
    quantity = {"cpu": "50m", "memory": "64Mi"}
    container = {"name": "main", "image": opts.platform_image, "imagePullPolicy": opts.pull_policy,
                 "command": [opts.python, "-I", "-c", code, *args],
                 "resources": {"requests": quantity, "limits": quantity},
                 "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                     "readOnlyRootFilesystem": True, "runAsNonRoot": True}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"tf-canary-{role}-{run}", "namespace": canary_namespace(opts),
                         "labels": _labels(opts, **{CANARY: role})},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
                     "terminationGracePeriodSeconds": 1,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [container]}}


def _exit_code(pod: dict | None) -> int | None:
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated is not None:
            return int(terminated.get("exitCode", -1))
    return None


def verdict_of(probe: int | None, control: int | None) -> tuple[str, str]:
    """The verdict from the two tries' exit codes (None: the pod did not finish)."""
    if probe == EXIT_CONNECTED:
        return NOT_ENFORCED, "a pod the default deny covers connected to another pod"
    if probe == EXIT_NEVER and control == EXIT_CONNECTED:
        return ENFORCED, "the default deny stopped the probe; the allowed control connected"
    if probe == EXIT_NEVER and control == EXIT_NEVER:
        return UNKNOWN, "even the connection a policy allows failed, so the stopped probe proves nothing"
    what = {None: "did not finish", EXIT_NEVER: "never connected", EXIT_CONNECTED: "connected"}
    return UNKNOWN, (f"the probe {what.get(probe, f'exited with {probe}')}, "
                     f"the control {what.get(control, f'exited with {control}')}")


class _Unknown(Exception):
    """The run cannot reach a verdict; the message says why."""


def run_canary(kube: Kube, opts: KubeOptions, *, timeout: float = POD_START_TIMEOUT,
               try_seconds: float = TRY_SECONDS) -> NetpolVerdict:
    """One run: apply the standing objects, start the pods, read the tries' exits, delete the pods."""
    ns, run = canary_namespace(opts), secrets.token_hex(3)
    port = 20000 + secrets.randbelow(30000)  # pods may share one network (a test node): a port per run
    try:
        for obj in standing_objects(opts):
            kube.apply(obj)
        listener = kube.create(canary_pod(opts, "listener", run, [str(port)]))["metadata"]["name"]
        ip = _wait(kube, ns, listener, timeout, "the listener pod to run", _running_ip)
        tries = {role: kube.create(canary_pod(opts, role, run, [ip, str(port), str(try_seconds)]))["metadata"]["name"]
                 for role in ("probe", "control")}
        codes = {role: _wait(kube, ns, name, timeout + try_seconds, f"the {role} pod to finish", _finished)
                 for role, name in tries.items()}
        state, why = verdict_of(codes["probe"], codes["control"])
    except _Unknown as e:
        state, why = UNKNOWN, str(e)
    except Exception as e:  # noqa: BLE001 - the canary reports what it could not do, it never fails the LCM
        state, why = UNKNOWN, f"the canary could not run: {message_of(e)}"
    finally:
        try:
            kube.delete_all("Pod", ns, f"{CANARY},{STACK}={dns_label(opts.stack)}")
        except Exception as e:  # noqa: BLE001 - left pods are deleted by the next run
            log.warning("network policy canary: deleting its pods failed: %s", message_of(e))
    return NetpolVerdict(state, why, time.time())


def _running_ip(pod: dict) -> str | None:
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        raise _Unknown(f"the listener pod stopped ({status.get('phase')}, exit {_exit_code(pod)})")
    return status.get("podIP") if status.get("phase") == "Running" else None


def _finished(pod: dict) -> int | None:
    return _exit_code(pod) if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded") else None


def _wait(kube: Kube, ns: str, name: str, timeout: float, what: str, ready):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = kube.get("Pod", ns, name)
        if pod is None:
            raise _Unknown(f"pod {ns}/{name} vanished")
        if (value := ready(pod)) is not None:
            return value
        time.sleep(0.5)
    raise _Unknown(f"timed out after {timeout:.0f}s waiting for {what}")


class NetpolCanary:
    """The last verdict, and one run at a time in a thread of its own."""

    def __init__(self, kube: Kube, opts: KubeOptions, *, max_age: float = MAX_AGE, **run_options: float):
        self._kube, self._opts, self._max_age, self._run_options = kube, opts, max_age, run_options
        self._verdict = NetpolVerdict(UNKNOWN, "the canary has not finished its first run")
        self._running: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> threading.Thread | None:
        """Start a run unless one is running; the thread (None: one was running)."""
        with self._lock:
            if self._running is not None and self._running.is_alive():
                return None
            # a one-shot run, not a periodic loop: it is started at LCM start and when a stale verdict is asked for
            self._running = threading.Thread(target=self._run, name="netpol-canary", daemon=True)
            self._running.start()
            return self._running

    def _run(self) -> None:
        verdict = run_canary(self._kube, self._opts, **self._run_options)
        self._verdict = verdict
        level = logging.INFO if verdict.state == ENFORCED else logging.WARNING
        log.log(level, "NetworkPolicy: %s%s", verdict.line,
                f" ({verdict.why})" if verdict.state != UNKNOWN else "")

    def verdict(self) -> NetpolVerdict:
        """The last verdict, never waiting; a stale one starts a new run in the background."""
        v = self._verdict
        if v.at and time.time() - v.at > self._max_age:
            self.start()
        return v

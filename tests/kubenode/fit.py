"""Whether a pod fits the test node: resource requests against allocatable, nodeSelector, taints.

Pure functions over the API's dicts. The checks and the Unschedulable
messages follow kube-scheduler's (NodeResourcesFit, NodeSelector, TaintToleration
for NoSchedule/NoExecute), for one node: "0/1 nodes are available: 1
Insufficient nvidia.com/gpu." Node affinity, pod (anti-)affinity, topology
spread and host ports are not evaluated.
"""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)$")


def quantity(value: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("500m", "2Gi", "1e3", 4) as a number."""
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"not a resource quantity: {value!r}")
    number, suffix = Decimal(m.group(1)), m.group(2)
    if suffix[:1] in ("e", "E"):
        return number * Decimal(10) ** int(suffix[1:])
    return number * Decimal(_SUFFIX[suffix])


def pod_requests(pod: dict) -> dict[str, Decimal]:
    """What the pod asks of a node: per resource, the larger of the containers' sum and the largest init
    container (init containers run one at a time), plus one `pods` slot. Limits stand in for missing
    requests, as the apiserver's defaulting does."""
    spec = pod.get("spec", {})

    def of(container: dict) -> dict[str, Decimal]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: quantity(v) for k, v in merged.items()}

    total: dict[str, Decimal] = {}
    for c in spec.get("containers", []):
        for k, v in of(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in spec.get("initContainers") or []:
        for k, v in of(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    total["pods"] = total.get("pods", Decimal(0)) + 1
    return total


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if not t.get("key"):
            if t.get("operator") == "Exists":
                return True
            continue
        if t["key"] != taint["key"]:
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def unfit_reasons(pod: dict, allocatable: dict[str, Decimal], used: dict[str, Decimal], labels: dict[str, str],
                  taints: list[dict]) -> list[str]:
    """Why the pod cannot go on this node, in the scheduler's words; empty when it fits."""
    spec = pod.get("spec", {})
    reasons = []
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        reasons.append("node(s) didn't match node selector")
    for taint in taints:
        if taint["effect"] in ("NoSchedule", "NoExecute") and not _tolerates(spec.get("tolerations") or [], taint):
            value = f"{taint['key']}: {taint['value']}" if taint.get("value") else taint["key"]
            reasons.append(f"node(s) had taint {{{value}}}, that the pod didn't tolerate")
    for name, want in sorted(pod_requests(pod).items()):
        if want <= 0:
            continue
        have = allocatable.get(name, Decimal(0)) - used.get(name, Decimal(0))
        if want > have:
            reasons.append("Too many pods" if name == "pods" else f"Insufficient {name}")
    return reasons


def unschedulable_message(reasons: list[str]) -> str:
    return "0/1 nodes are available: " + ", ".join(f"1 {r}" for r in reasons) + "."


def add(a: dict[str, Decimal], b: dict[str, Decimal]) -> dict[str, Decimal]:
    return {k: a.get(k, Decimal(0)) + b.get(k, Decimal(0)) for k in a.keys() | b.keys()}

"""What a pod's status says to the lifecycle: is it alive, and if not (or stuck), why, in the cluster's words.

Pure: a pod as the API returns it (a dict) and the time now in, a
`PodState` out. The reasons are the ones a user needs to read:

- Unschedulable, with the scheduler's message ("0/3 nodes are available:
  3 Insufficient nvidia.com/gpu."), and an image that cannot be pulled
  (ErrImagePull, ImagePullBackOff with the kubelet's message): the pod is
  still alive (it may yet start) until `pending_timeout` passed since it was
  created; then it counts as ended, and the lifecycle reports the learner
  failed with that reason.
- A container config or image name that can never work
  (CreateContainerConfigError, InvalidImageName, ErrImageNeverPull): ended at once.
- OOMKilled (with the container's memory limit), Evicted (with the
  kubelet's message), any other termination with its exit code.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

_WAIT_TRANSIENT = frozenset({"ErrImagePull", "ImagePullBackOff"})
_WAIT_FATAL = frozenset({"CreateContainerConfigError", "CreateContainerError", "InvalidImageName",
                         "ErrImageNeverPull"})


@dataclass(frozen=True)
class PodState:
    alive: bool
    reason: str = ""
    succeeded: bool = False


def _created(pod: dict) -> dt.datetime | None:
    stamp = pod.get("metadata", {}).get("creationTimestamp")
    if not stamp:
        return None
    return dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))


def _terminated(status: dict, limits: dict[str, dict]) -> str:
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if not term:
            continue
        reason, code = term.get("reason", ""), term.get("exitCode")
        if reason == "OOMKilled":
            limit = limits.get(cs.get("name", ""), {}).get("memory")
            return f"OOMKilled: the container went over its memory limit{f' of {limit} bytes' if limit else ''}"
        if code not in (None, 0):
            return f"{reason or 'Error'}: the container exited with code {code}" + (
                f": {term['message']}" if term.get("message") else "")
    return ""


def _waiting(status: dict) -> tuple[str, str]:
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") in _WAIT_TRANSIENT | _WAIT_FATAL:
            return waiting["reason"], waiting.get("message", "")
    return "", ""


def pod_state(pod: dict, now: dt.datetime, pending_timeout: float) -> PodState:
    """Whether the pod still runs (or may yet run), and the cluster's reason when it ended or is stuck."""
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    # each container's limits, by name (a learner pod's controller and learner have their own)
    limits = {c.get("name", ""): (c.get("resources") or {}).get("limits") or {}
              for c in (pod.get("spec") or {}).get("containers") or []}
    if phase == "Succeeded":
        return PodState(alive=False, succeeded=True)
    if phase == "Failed":
        if status.get("reason") == "Evicted":
            return PodState(alive=False, reason=f"Evicted: {status.get('message', 'the node evicted the pod')}")
        reason = _terminated(status, limits) or ": ".join(
            p for p in (status.get("reason", "Failed"), status.get("message", "")) if p)
        return PodState(alive=False, reason=reason)
    if phase == "Running":
        return PodState(alive=True)
    if phase != "Pending":
        # Unknown: the node stopped reporting; it may come back
        return PodState(alive=True, reason=f"{phase}: {status.get('message', 'the pod state is unknown')}")
    waited, message = _waiting(status)
    if waited in _WAIT_FATAL:
        return PodState(alive=False, reason=f"{waited}: {message}".rstrip(": "))
    reason = f"{waited}: {message}".rstrip(": ") if waited else ""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            reason = f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}".rstrip(": ")
    created = _created(pod)
    if reason and created is not None and (now - created).total_seconds() > pending_timeout:
        return PodState(alive=False, reason=f"{reason} (still pending after {pending_timeout:g}s)")
    return PodState(alive=True, reason=reason)


_SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity ("3800m", "16Gi", "1e3") as a number; ValueError naming it when it is not one."""
    text = str(value).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            number = text[:-len(suffix)]
            break
    else:
        suffix, number = "", text
    try:
        return float(number) * _SUFFIX[suffix]
    except ValueError:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None

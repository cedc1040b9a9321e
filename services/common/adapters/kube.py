"""The Kubernetes API, as the platform uses it: plain-dict objects in, plain-dict objects out.

The only module that imports the `kubernetes` client. The backend's
builders make objects as the API's JSON shapes (dicts), so this adapter
sends them as they are through the client's authenticated REST layer
instead of converting to and from the generated model classes; a small
table maps each kind the platform uses to its URL.

Errors become the platform's: an API server that cannot be reached or
answers 5xx is `Unavailable` (callers retry), 404 `NotFound`, 409
`Conflict`, 422 `InvalidArgument`; 403 is `ResourceExhausted` when a
ResourceQuota refused the object (its message is the quota's own words,
"exceeded quota: tf-quota, requested: ..., used: ..., limited: ...") and
`PermissionDenied` otherwise.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

import urllib3.exceptions
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from trainforge_services.common.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TrainforgeError,
    Unavailable,
)

TIMEOUT = 30.0


@dataclass(frozen=True)
class Kind:
    group_version: str  # "v1" or "networking.k8s.io/v1"
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        ns = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{base}{ns}/{self.plural}" + (f"/{name}" if name else "")


KINDS = {
    "Namespace": Kind("v1", "namespaces", namespaced=False),
    "Node": Kind("v1", "nodes", namespaced=False),
    "ConfigMap": Kind("v1", "configmaps"),
    "Secret": Kind("v1", "secrets"),
    "Service": Kind("v1", "services"),
    "Pod": Kind("v1", "pods"),
    "ResourceQuota": Kind("v1", "resourcequotas"),
    "LimitRange": Kind("v1", "limitranges"),
    "Event": Kind("v1", "events"),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies"),
    "PriorityClass": Kind("scheduling.k8s.io/v1", "priorityclasses", namespaced=False),
}


def kind_of(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise InvalidArgument(f"kind {name} is not one the platform manages",
                              details=[{"field": "kind", "message": "unknown"}]) from None


def _message(status: int, body: str) -> str:
    try:
        return str(json.loads(body).get("message") or body)
    except ValueError:
        return body or f"HTTP {status}"


def translate(status: int, body: str, what: str) -> TrainforgeError:
    message = _message(status, body)
    if status == 403 and "exceeded quota" in message:
        return ResourceExhausted(message)
    if status == 403 and "status unknown for quota" in message:
        # a quota just made, not yet counted by the controller manager: asking again soon succeeds
        return Unavailable(f"{what}: {message}")
    if status == 403:
        return PermissionDenied(f"{what}: {message}")
    if status == 404:
        return NotFound(f"{what}: {message}")
    if status == 409:
        return Conflict(f"{what}: {message}")
    if status in (400, 422):
        return InvalidArgument(f"{what}: {message}")
    if status == 401:
        return PermissionDenied(f"{what}: the API server refused the credentials: {message}")
    return Unavailable(f"{what}: the API server answered {status}: {message}")


class Kube:
    """One API server, through a kubeconfig file or the in-cluster service account."""

    def __init__(self, kubeconfig: str = "", context: str = "", *, timeout: float = TIMEOUT):
        try:
            if kubeconfig:
                self._api = k8s_config.new_client_from_config(kubeconfig, context or None, persist_config=False)
            else:
                conf = k8s.Configuration()
                k8s_config.load_incluster_config(conf)
                self._api = k8s.ApiClient(conf)
        except (k8s_config.ConfigException, OSError, ValueError) as e:
            field = "kube_config" if kubeconfig else "kube_config (in-cluster)"
            raise InvalidArgument(f"cannot load the Kubernetes configuration {kubeconfig or '(in-cluster)'}: {e}",
                                  details=[{"field": field, "message": str(e)}]) from None
        self._timeout = timeout

    def _call(self, method: str, path: str, what: str, *, body: Any = None, query: dict | None = None,
              content_type: str = "application/json") -> dict:
        if query:
            path = f"{path}?{urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})}"
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            _m, url, hdrs, data, _p = self._api.param_serialize(method, path, header_params=headers, body=body,
                                                                 auth_settings=["BearerToken"])
            response = self._api.call_api(method, url, header_params=hdrs, body=data,
                                          _request_timeout=self._timeout)
            response.read()
        except ApiException as e:
            raise translate(int(e.status or 0), e.body or "", what) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Unavailable(f"{what}: the Kubernetes API server cannot be reached: {e}") from None
        text = (response.data or b"").decode()
        if not 200 <= response.status < 300:
            raise translate(response.status, text, what)
        return json.loads(text) if text else {}

    @staticmethod
    def _where(obj: dict) -> tuple[Kind, str | None, str]:
        meta = obj.get("metadata", {})
        return kind_of(obj["kind"]), meta.get("namespace"), meta.get("name", "")

    def create(self, obj: dict) -> dict:
        """Create `obj`; the stored object (with its uid). Conflict when it exists."""
        kind, ns, name = self._where(obj)
        return self._call("POST", kind.path(ns), f"create {obj['kind']} {ns or ''}/{name}", body=obj)

    def apply(self, obj: dict) -> dict:
        """Create `obj`, or replace the stored one's content with it (labels, spec, data: as given)."""
        try:
            return self.create(obj)
        except Conflict:
            pass
        kind, ns, name = self._where(obj)
        current = self.get(obj["kind"], ns, name)
        if current is None:
            return self.create(obj)
        replacement = {**obj, "metadata": {**current["metadata"], **obj["metadata"]}}
        return self._call("PUT", kind.path(ns, name), f"replace {obj['kind']} {ns or ''}/{name}", body=replacement)

    def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        try:
            return self._call("GET", kind_of(kind).path(namespace, name), f"get {kind} {namespace or ''}/{name}")
        except NotFound:
            return None

    def list(self, kind: str, namespace: str | None = None, selector: str = "") -> list[dict]:
        """Objects of `kind` in `namespace` (None: every namespace) matching the label selector."""
        found = self._call("GET", kind_of(kind).path(namespace), f"list {kind}",
                           query={"labelSelector": selector or None})
        return list(found.get("items") or [])

    def delete(self, kind: str, namespace: str | None, name: str, *, grace: int | None = None) -> bool:
        """Delete one object, its dependents in the background (the garbage collector); False if it was gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        try:
            self._call("DELETE", kind_of(kind).path(namespace, name), f"delete {kind} {namespace or ''}/{name}",
                       body=body)
        except NotFound:
            return False
        return True

    def delete_all(self, kind: str, namespace: str, selector: str) -> int:
        """Delete every object of `kind` in `namespace` matching the selector (pods with their own grace
        period: a controller gets its SIGTERM and time to write its final status); how many there were."""
        names = [o["metadata"]["name"] for o in self.list(kind, namespace, selector)
                 if not o["metadata"].get("deletionTimestamp")]
        return sum(self.delete(kind, namespace, n) for n in names)

    def patch_status(self, kind: str, namespace: str | None, name: str, patch: dict) -> dict:
        """Merge-patch an object's status subresource (node capacity in tests, pod status by a test node)."""
        return self._call("PATCH", kind_of(kind).path(namespace, name) + "/status", f"patch {kind} {name} status",
                          body=patch, content_type="application/merge-patch+json")

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> Kube:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

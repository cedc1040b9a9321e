"""From a pod's container spec to a local process's argv, env and working directory.

Env follows the kubelet's rules: `envFrom` first, then `env` in order, with
`$(VAR)` references to earlier variables expanded (`$$` escapes) in values,
command and args. `valueFrom` resolves `fieldRef` (metadata.name/namespace/uid,
metadata.labels['k'], metadata.annotations['k'], spec.nodeName,
spec.serviceAccountName, status.podIP/hostIP: 127.0.0.1), `resourceFieldRef`
(limits/requests of the container, with the divisor), and `secretKeyRef` /
`configMapKeyRef` through the API. A missing, non-optional Secret or
ConfigMap raises `ConfigError`, which the node reports as the kubelet does
(waiting, CreateContainerConfigError) and retries.

Volumes have no mount namespace here: each emptyDir, secret and configMap
volume is a directory under the pod's directory on the node, and a mount
path found as a whole path prefix in command, args, env values or
workingDir is replaced by that directory, except in a longer path that
exists on the node (the node's own interpreter and code, which pods run at
their own paths, may lie under /tmp). A program that builds the path at
run time from other pieces does not see the substitution. There is no
cluster DNS either: names ending in `.svc` or `.svc.cluster.local` in
command, args and env values become 127.0.0.1, where every pod listens.
"""

from __future__ import annotations

import base64
import math
import re
from pathlib import Path

from tests.kubenode.fit import quantity
from tests.kubenode.rest import ApiError, Kube

POD_IP = "127.0.0.1"
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")
# a cluster DNS name (<service>.<namespace>.svc[.cluster.local], <pod>.<subdomain>.<ns>.svc...): every pod and
# service of the test node is on its loopback, and there is no cluster DNS
_CLUSTER_NAME = re.compile(r"(?<![\w.-])[a-z0-9]([-a-z0-9.]*[a-z0-9])?\.svc(\.cluster\.local)?(?![\w.-])")


class ConfigError(RuntimeError):
    """A container's configuration cannot be made (a missing Secret or ConfigMap, an unsupported volume)."""


def expand(text: str, env: dict[str, str]) -> str:
    """$(VAR) from env; unknown references stay as written; $$ is a literal $."""
    return _REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _field(pod: dict, path: str) -> str:
    meta, spec = pod["metadata"], pod.get("spec", {})
    simple = {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", "default"),
              "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
              "spec.serviceAccountName": spec.get("serviceAccountName", ""), "status.podIP": POD_IP,
              "status.podIPs": POD_IP, "status.hostIP": POD_IP}
    if path in simple:
        return simple[path]
    m = _LABEL_REF.match(path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    raise ConfigError(f"fieldRef.fieldPath {path!r} is not supported by the test node")


def _resource(container: dict, ref: dict) -> str:
    kind, _, name = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:
        raise ConfigError(f"resourceFieldRef {ref['resource']!r}: the container sets no {kind} for {name} "
                          "(the test node has no node allocatable fallback)")
    divisor = quantity(ref.get("divisor") or "1")
    return str(math.ceil(quantity(value) / divisor))


class Resolver:
    """Reads Secrets and ConfigMaps of one namespace through the API, each once per container start."""

    def __init__(self, kube: Kube, namespace: str):
        self.kube, self.namespace = kube, namespace

    def data(self, kind: str, name: str, optional: bool) -> dict[str, str] | None:
        plural = "secrets" if kind == "Secret" else "configmaps"
        try:
            obj = self.kube.get(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
        except ApiError as e:
            if e.status == 404:
                if optional:
                    return None
                raise ConfigError(f'{plural[:-1]} "{name}" not found') from None
            raise
        if kind == "Secret":
            return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return dict(obj.get("data") or {})

    def key(self, kind: str, ref: dict) -> str | None:
        data = self.data(kind, ref["name"], bool(ref.get("optional")))
        if data is None:
            return None
        if ref["key"] not in data:
            if ref.get("optional"):
                return None
            raise ConfigError(f"couldn't find key {ref['key']} in {kind} {self.namespace}/{ref['name']}")
        return data[ref["key"]]


def container_env(pod: dict, container: dict, base: dict[str, str], resolver: Resolver) -> dict[str, str]:
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if field in source:
                ref = source[field]
                env.update({prefix + k: v for k, v in (resolver.data(kind, ref["name"], bool(ref.get("optional")))
                                                       or {}).items()})
    for var in container.get("env") or []:
        value_from = var.get("valueFrom")
        if value_from is None:
            env[var["name"]] = expand(var.get("value", ""), env)
        elif "fieldRef" in value_from:
            env[var["name"]] = _field(pod, value_from["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in value_from:
            env[var["name"]] = _resource(container, value_from["resourceFieldRef"])
        else:
            kind, ref = (("Secret", value_from["secretKeyRef"]) if "secretKeyRef" in value_from
                         else ("ConfigMap", value_from["configMapKeyRef"]))
            value = resolver.key(kind, ref)
            if value is not None:
                env[var["name"]] = value
    return env


def make_volumes(pod: dict, pod_dir: Path, resolver: Resolver) -> dict[str, Path]:
    """Each volume as a directory on the node (hostPath: the path itself); ConfigError for other kinds."""
    out: dict[str, Path] = {}
    for vol in pod.get("spec", {}).get("volumes") or []:
        name = vol["name"]
        if "hostPath" in vol:
            out[name] = Path(vol["hostPath"]["path"])
            continue
        d = pod_dir / "volumes" / name
        d.mkdir(parents=True, exist_ok=True)
        out[name] = d
        if "emptyDir" in vol:
            continue
        for kind, field in (("Secret", "secret"), ("ConfigMap", "configMap")):
            if field in vol:
                src = vol[field]
                ref_name = src.get("secretName") if kind == "Secret" else src.get("name")
                data = resolver.data(kind, ref_name, bool(src.get("optional"))) or {}
                items = src.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] not in data:
                        raise ConfigError(f"volume {name}: key {item['key']} is not in {kind} {ref_name}")
                    target = d / item["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(data[item["key"]])
                break
        else:
            kinds = sorted(set(vol) - {"name"})
            raise ConfigError(f"volume {name}: {', '.join(kinds)} volumes are not supported by the test node "
                              "(emptyDir, secret, configMap and hostPath are)")
    return out


def mount_map(container: dict, volumes: dict[str, Path]) -> list[tuple[str, str]]:
    """(mountPath, local directory) pairs, longest mount path first so nested mounts win."""
    pairs = []
    for m in container.get("volumeMounts") or []:
        if m["name"] not in volumes:
            raise ConfigError(f"volumeMount {m['name']!r} names no volume of the pod")
        local = volumes[m["name"]] / m.get("subPath", "")
        local.mkdir(parents=True, exist_ok=True)
        pairs.append((m["mountPath"].rstrip("/") or "/", str(local)))
    return sorted(pairs, key=lambda p: -len(p[0]))


def substitute(text: str, mounts: list[tuple[str, str]]) -> str:
    """Mount paths, as whole path prefixes, replaced by their local directories.

    A longer path below a mount path that exists on the node is left alone: the pods run the node's own
    interpreter and code at their own paths, which may lie under a mount path (a checkout under /tmp,
    with an emptyDir mounted at /tmp).
    """
    for mount, local in mounts:
        if mount == "/":
            continue

        def local_path(m: re.Match, mount: str = mount, local: str = local) -> str:
            below = m.group("below") or ""
            return m.group(0) if below and Path(mount + below).exists() else local + below

        text = re.sub(r"(?<![\w./-])" + re.escape(mount) + r"(?P<below>/[^\s:;,'\"=]*)?(?=$|[^\w.-])", local_path,
                      text)
    return text


def loopback(text: str) -> str:
    """Cluster DNS names replaced by the node's loopback address."""
    return _CLUSTER_NAME.sub(POD_IP, text)


def process_spec(pod: dict, container: dict, base_env: dict[str, str], resolver: Resolver,
                 volumes: dict[str, Path], pod_dir: Path) -> tuple[list[str], dict[str, str], Path]:
    """argv, env and working directory for one container; ConfigError when it cannot run here."""
    command = container.get("command") or []
    if not command:
        raise ConfigError(f"container {container['name']}: the test node runs a container's `command` (it has no "
                          f"image to take an entrypoint from: {container.get('image')})")
    mounts = mount_map(container, volumes)
    env = container_env(pod, container, base_env, resolver)
    argv = [loopback(substitute(expand(a, env), mounts)) for a in command + (container.get("args") or [])]
    env = {k: loopback(substitute(v, mounts)) for k, v in env.items()}
    cwd = Path(substitute(container["workingDir"], mounts)) if container.get("workingDir") else pod_dir
    cwd.mkdir(parents=True, exist_ok=True)
    return argv, env, cwd

"""The test node's pure parts: quantities, fit against allocatable/selector/taints, env and mount paths."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from tests.kubenode import fit
from tests.kubenode.containers import ConfigError, expand, mount_map, process_spec, substitute


def pod(requests=None, limits=None, selector=None, tolerations=None, init=None):
    res = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    spec = {"containers": [{"name": "c", "image": "x", "command": ["true"], "resources": res}]}
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"rank": "3"}}, "spec": spec}


@pytest.mark.parametrize("text,value", [("500m", Decimal("0.5")), ("2Gi", Decimal(2 * 2**30)), ("1e3", Decimal(1000)),
                                        ("4", Decimal(4)), ("1.5k", Decimal(1500)), (3, Decimal(3))])
def test_quantity(text, value):
    assert fit.quantity(text) == value


def test_quantity_rejects_garbage():
    with pytest.raises(ValueError, match="not a resource quantity"):
        fit.quantity("lots")


def test_requests_sum_containers_and_take_the_largest_init_container():
    p = pod(requests={"cpu": "1"}, init=[{"name": "i", "resources": {"requests": {"cpu": "3"}}}])
    p["spec"]["containers"].append({"name": "d", "resources": {"limits": {"cpu": "500m", "nvidia.com/gpu": "1"}}})
    assert fit.pod_requests(p) == {"cpu": Decimal(3), "nvidia.com/gpu": Decimal(1), "pods": Decimal(1)}


def test_unfit_reasons_use_the_schedulers_words():
    alloc = {"cpu": Decimal(8), "nvidia.com/gpu": Decimal(2), "pods": Decimal(10)}
    used = {"nvidia.com/gpu": Decimal(1)}
    p = pod(requests={"nvidia.com/gpu": "2"}, selector={"gpu": "a100"})
    reasons = fit.unfit_reasons(p, alloc, used, {"gpu": "t4"}, [{"key": "gpu", "effect": "NoSchedule"}])
    assert reasons == ["node(s) didn't match node selector", "node(s) had taint {gpu}, that the pod didn't tolerate",
                       "Insufficient nvidia.com/gpu"]
    assert fit.unschedulable_message(reasons[2:]) == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    ok = pod(requests={"nvidia.com/gpu": "1"}, selector={"gpu": "t4"},
             tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert fit.unfit_reasons(ok, alloc, used, {"gpu": "t4"}, [{"key": "gpu", "effect": "NoSchedule"}]) == []


def test_expand_follows_the_kubelet():
    assert expand("$(A)-$(B)-$$(A)-$(MISSING)", {"A": "1", "B": "2"}) == "1-2-$(A)-$(MISSING)"


def test_mount_paths_are_replaced_as_whole_prefixes(tmp_path):
    vols = {"data": tmp_path / "data", "ckpt": tmp_path / "ckpt"}
    c = {"name": "c", "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                       {"name": "ckpt", "mountPath": "/data/ckpt"}]}
    mounts = mount_map(c, vols)
    assert substitute("--in=/data/x --ck /data/ckpt/1 /database /data", mounts) == (
        f"--in={tmp_path}/data/x --ck {tmp_path}/ckpt/1 /database {tmp_path}/data")


def test_a_node_path_below_a_mount_path_is_left_alone(tmp_path):
    """A checkout under /tmp keeps its paths when a pod mounts an emptyDir at /tmp (the pods run the
    node's interpreter and code at their own paths)."""
    node_file = tmp_path / "repo" / "python"
    node_file.parent.mkdir()
    node_file.write_text("")
    top = "/" + tmp_path.parts[1]  # e.g. /tmp
    mounts = mount_map({"name": "c", "volumeMounts": [{"name": "tmp", "mountPath": top}]}, {"tmp": tmp_path / "vol"})
    assert substitute(f"{node_file} -o {top}/not-on-the-node/x TMPDIR={top}", mounts) == (
        f"{node_file} -o {tmp_path}/vol/not-on-the-node/x TMPDIR={tmp_path}/vol")


class NoApi:
    def get(self, path):
        raise AssertionError(f"no API call expected, got {path}")


def test_process_spec_resolves_env_fields_and_mounts(tmp_path: Path):
    from tests.kubenode.containers import Resolver

    p = pod()
    c = {"name": "c", "image": "img", "command": ["sh", "-c"], "args": ["echo $(RANK) > /out/r"],
         "workingDir": "/out", "volumeMounts": [{"name": "out", "mountPath": "/out"}],
         "env": [{"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['rank']"}}},
                 {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                 {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                 {"name": "ADDR", "value": "$(IP):29500"}]}
    argv, env, cwd = process_spec(p, c, {"PATH": "/bin"}, Resolver(NoApi(), "ns"), {"out": tmp_path / "o"}, tmp_path)
    assert argv == ["sh", "-c", f"echo 3 > {tmp_path}/o/r"]
    assert (env["RANK"], env["POD"], env["ADDR"], env["PATH"]) == ("3", "p", "127.0.0.1:29500", "/bin")
    assert cwd == tmp_path / "o"


def test_a_container_without_command_is_a_config_error(tmp_path):
    from tests.kubenode.containers import Resolver

    with pytest.raises(ConfigError, match="runs a container's `command`"):
        process_spec(pod(), {"name": "c", "image": "img"}, {}, Resolver(NoApi(), "ns"), {}, tmp_path)


def test_cluster_dns_names_become_the_loopback_address():
    from tests.kubenode.containers import loopback

    assert loopback("job-1-0.job-1.team-a.svc.cluster.local:29500 http://s3.store.svc:9000/x svc.example.com") == (
        "127.0.0.1:29500 http://127.0.0.1:9000/x svc.example.com")


def test_missing_binaries_fail_with_the_command_to_run(tmp_path, monkeypatch):
    from tests.kube import KubeUnavailable, bin_dir

    monkeypatch.setenv("TF_KUBE_BIN", str(tmp_path))
    with pytest.raises(KubeUnavailable, match=r"kube-apiserver is missing: run `make kube`"):
        bin_dir()

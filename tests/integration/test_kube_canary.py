"""The NetworkPolicy canary (services/lcm/backends/kubernetes/canary.py) against the real kube-apiserver and
kube-controller-manager (tests/kube.py) with the pods run by the TEST NODE (tests/kubenode/).

The test node runs every pod as a local process on 127.0.0.1: there is no network namespace and no CNI, so a
NetworkPolicy is stored and enforced by nothing. The canary must see that and say "NOT enforced"; an API it
cannot reach is "unknown", with the reason, never a verdict it did not see.
"""

from __future__ import annotations

import sys

import pytest

from tests.kube import write_kubeconfig
from tests.servers import free_port, wait_for
from trainforge_services.common.adapters.kube import Kube
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.backends.kubernetes import canary
from trainforge_services.lcm.backends.kubernetes.backend import KubernetesBackend
from trainforge_services.lcm.backends.kubernetes.naming import STACK, KubeOptions

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def opts(unique) -> KubeOptions:
    return KubeOptions(stack=f"c{unique}", namespace_prefix=f"c{unique[:6]}-", python=sys.executable)


@pytest.fixture
def kube(kube_cluster, opts):
    k = Kube(str(kube_cluster.kubeconfig))
    yield k
    k.delete("Namespace", None, canary.canary_namespace(opts))
    k.close()


def test_on_the_test_node_the_canary_sees_the_probe_connect_and_says_not_enforced(kube_node, kube, opts):
    verdict = canary.run_canary(kube, opts, try_seconds=5)
    assert verdict.line == "NOT enforced", verdict
    assert verdict.state == canary.NOT_ENFORCED and verdict.at > 0
    ns = canary.canary_namespace(opts)
    # the policy it tested against is there, as a team's; its pods are gone (or going)
    assert kube.get("NetworkPolicy", ns, "tf-default-deny")["spec"]["policyTypes"] == ["Ingress", "Egress"]
    live = [p for p in kube.list("Pod", ns, canary.CANARY) if not p["metadata"].get("deletionTimestamp")]
    assert live == []


def test_the_backend_starts_the_canary_and_reports_its_verdict_with_its_capacity(kube_cluster, kube_node, kube,
                                                                                  opts, tmp_path, monkeypatch):
    monkeypatch.setenv("TF_STACK_ID", opts.stack)
    settings = LcmSettings(backend="kubernetes", kube_config=str(kube_cluster.kubeconfig), state_dir=tmp_path,
                           kube_namespace_prefix=opts.namespace_prefix, kube_python=sys.executable)
    backend = KubernetesBackend(settings)
    try:
        first = backend.capacity().network_policy
        # before its first run ends it claims nothing
        assert first == "NOT enforced" or first.startswith("unknown (the canary has not finished"), first
        wait_for(lambda: backend.capacity().network_policy == "NOT enforced", 120, "the canary's verdict")
    finally:
        backend.close()


def test_a_canary_that_cannot_reach_the_api_says_unknown_and_why(kube_cluster, opts, tmp_path):
    config = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{free_port()}", kube_cluster.token,
                              kube_cluster.ca_file)
    with Kube(str(config), timeout=2) as nowhere:
        verdict = canary.run_canary(nowhere, opts, timeout=5, try_seconds=1)
    assert verdict.state == canary.UNKNOWN
    assert verdict.line.startswith("unknown (the canary could not run: "), verdict.line


def test_a_pod_that_never_runs_is_unknown_not_a_verdict(kube, opts):
    # no node binds pods asking for more than any has: the listener stays Pending
    big = opts.model_copy(update={"stack": opts.stack + "-big"})
    pod = canary.canary_pod(big, "listener", "x", ["1"])
    assert pod["metadata"]["labels"][STACK] == big.stack
    verdict = canary.run_canary(_Huge(kube), big, timeout=3, try_seconds=1)
    assert verdict.state == canary.UNKNOWN
    assert "timed out after 3s waiting for the listener pod to run" in verdict.line, verdict.line


class _Huge:
    """The real API, with the canary's pods asking for more memory than any node has."""

    def __init__(self, kube: Kube):
        self._kube = kube

    def create(self, obj: dict) -> dict:
        if obj["kind"] == "Pod":
            obj["spec"]["containers"][0]["resources"] = {"requests": {"memory": "64Ti"}, "limits": {"memory": "64Ti"}}
        return self._kube.create(obj)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._kube, name)

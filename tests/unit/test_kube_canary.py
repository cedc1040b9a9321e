"""The NetworkPolicy canary's objects and verdicts (services/lcm/backends/kubernetes/canary.py); the runs against
a real API and the test node are in tests/integration/test_kube_canary.py."""

from __future__ import annotations

import kubernetes_validate
import pytest

from trainforge_services.lcm.backends.kubernetes import canary
from trainforge_services.lcm.backends.kubernetes.naming import KubeOptions

VERSION = "1.33.0"
OPTS = KubeOptions(stack="s1", namespace_prefix="tf-", platform_image="trainforge/platform:1")


def test_every_object_passes_the_strict_schema_and_the_pods_are_restricted():
    objects = [*canary.standing_objects(OPTS), canary.canary_pod(OPTS, "listener", "ab12", ["20001"]),
               *(canary.canary_pod(OPTS, role, "ab12", ["10.0.0.5", "20001", "10"]) for role in ("probe", "control"))]
    for obj in objects:
        kubernetes_validate.validate(obj, VERSION, strict=True)
    ns, deny = objects[0], objects[1]
    assert ns["metadata"]["name"] == "tf-netpol-canary"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    for pod in objects[4:]:
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsNonRoot"] is True
        assert spec["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert spec["containers"][0]["image"] == "trainforge/platform:1"
    # the allow policies name the control and the listener only: the probe is covered by the deny alone
    allowed = {str(o["spec"]) for o in objects[2:4]}
    assert all("probe" not in text for text in allowed)


@pytest.mark.parametrize(("probe", "control", "line"), [
    (0, 0, "NOT enforced"), (0, None, "NOT enforced"), (0, 3, "NOT enforced"),
    (3, 0, "enforced"),
    (3, 3, "unknown (even the connection a policy allows failed, so the stopped probe proves nothing)"),
    (None, 0, "unknown (the probe did not finish, the control connected)"),
    (1, 0, "unknown (the probe exited with 1, the control connected)"),
    (3, None, "unknown (the probe never connected, the control did not finish)"),
])
def test_the_verdict_says_only_what_the_tries_saw(probe, control, line):
    state, why = canary.verdict_of(probe, control)
    assert canary.NetpolVerdict(state, why).line == line


def test_before_its_first_run_the_canary_claims_nothing():
    c = canary.NetpolCanary(kube=None, opts=OPTS)  # never started: no call reaches the API
    assert c.verdict().line == "unknown (the canary has not finished its first run)"

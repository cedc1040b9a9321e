"""Egress of learners on the docker backend: none by default, not even a host service on all addresses; the
admin's allowed destinations only, narrowed by the team's policy.

The learners run in containers on a private engine (tests/engine.py, which
runs dockerd with `--iptables=false`: no firewall rule of the engine's
stops anything). The host's echo server listens on all addresses (0.0.0.0),
so it would answer at the attempt's bridge gateway if the bridge had an
address on the host; the runner relays only what the policy allows into the
container (trainforge_services.common.relay), as the local sandbox does.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.integration import test_sandbox_egress as local
from tests.integration.sandbox_jobs import docker_platform, engine_daemon  # noqa: F401 - fixtures

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

HTTP = "GET / HTTP/1.0\r\n\r\n"


@pytest.fixture
def any_echo() -> Iterator[int]:
    """A TCP echo server on all the host's addresses (0.0.0.0)."""
    yield from local.echo_server("0.0.0.0")


def test_without_a_policy_nothing_is_reachable_not_even_the_gateway(docker_platform, any_echo,  # noqa: F811
                                                                    etcd_server, mongo_server, osmem_server,
                                                                    monkeypatch, unique):
    monkeypatch.delenv("TF_EGRESS", raising=False)
    got = local.outcomes(docker_platform, f"dg-none-{unique}", [
        ["echo at the gateway", "gateway", any_echo, "hi"], ["echo by address", "127.0.0.1", any_echo, "hi"],
        ["echo by name", "localhost", any_echo, "hi"], ["api at the gateway", "gateway", docker_platform.api_port,
                                                        HTTP],
        ["outside", "1.1.1.1", 443, ""], *local.platform_ports(docker_platform, etcd_server, mongo_server, osmem_server)])
    assert got.pop("env").split()[1] == "none"
    assert set(got.values()) == {"BLOCKED"} and len(got) == 10, got


def test_an_allowed_host_port_is_reached_and_nothing_else(docker_platform, any_echo, etcd_server,  # noqa: F811
                                                          mongo_server, osmem_server, monkeypatch, unique):
    local.allowed_only(docker_platform, any_echo, f"dg-host-{unique}", [
        ["echo at the gateway", "gateway", any_echo, "hi"],
        *local.platform_ports(docker_platform, etcd_server, mongo_server, osmem_server)], monkeypatch)


def test_a_team_policy_narrows_the_admins(docker_platform, any_echo, monkeypatch, unique):  # noqa: F811
    local.team_narrows(docker_platform, any_echo, f"dg-team-{unique}", monkeypatch)


def test_a_named_host_is_reached_by_its_name(docker_platform, any_echo, monkeypatch, unique):  # noqa: F811
    """A host name in the policy gets a loopback address of its own in the container's hosts file."""
    name = socket.gethostname().lower()  # this host's name, which resolves here; the echo is on every address
    socket.getaddrinfo(name, any_echo)
    monkeypatch.setenv("TF_EGRESS", f"{name}:{any_echo}")
    got = local.outcomes(docker_platform, f"dg-name-{unique}", [["echo by name", name, any_echo, "hi"],
                                                          ["the name's other port", name, any_echo + 1, ""]])
    assert got == {"env": got["env"], "echo by name": "REACHED", "the name's other port": "BLOCKED"}, got

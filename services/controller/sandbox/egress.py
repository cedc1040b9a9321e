"""A sandboxed learner's egress: the relays (trainforge_services.common.relay) in the job's network namespace.

The job's network namespace has only loopback and no route out
(netns.py), so nothing beyond the job is reachable unless the controller
relays it: for each destination the policy allows it opens a listening
socket inside the namespace and relays every connection from the host's
side (relay.py says at which address each destination is reached). The
hosts file bound over the learner's `/etc/hosts` names the host names'
loopback addresses.

As root the controller enters the named namespace itself (a thread that
joins it with setns(2)) and puts an IPv4 destination outside 127/8 on its
loopback (netns.add_address). Without root (`isolation: userns`) it cannot:
`listen` is then userns.listen_in, a helper that joins the job's user and
network namespaces, adds the addresses and hands the listening sockets back
over a unix socket; the relaying is the same.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from trainforge_services.common.egress import Policy
from trainforge_services.common.relay import (
    EgressError,
    Relays,
    hosts_file,
    listen_in,
    plan,
    store_destination,
)

from . import netns

__all__ = ["Egress", "EgressError", "hosts_file", "plan", "store_destination"]


class Egress(Relays):
    """The forwarders of one learner's sandbox, in the job's namespace `netns_name` at `netns_path`."""

    def __init__(self, policy: Policy, netns_name: str, netns_path: Path, store_endpoint: str = "",
                 listen: Callable[[list[tuple[str, int]]], list[socket.socket]] | None = None):
        self.netns_name, self.netns_path = netns_name, netns_path
        super().__init__(policy, store_endpoint, listen or self._listen_as_root)

    def _listen_as_root(self, addresses: list[tuple[str, int]]) -> list[socket.socket]:
        for addr, _ in addresses:
            netns.add_address(self.netns_path, self.netns_name, addr)
        return listen_in(self.netns_path, addresses)

"""Egress policy for sandboxed learners: what, beyond its own job's ranks, a learner may connect to.

A policy is `none` (the default), or a comma-separated list whose items are
`store` (the object store's S3 endpoint) and `host:port` destinations, e.g.
`store,pypi.internal:443,10.0.0.5:8080`. The admin's setting (TF_EGRESS) is
the most any job may get; a team's own policy (on its quota record) narrows
it, never widens it: a job gets the items both allow, and the admin's
policy when its team has none of its own. Named here because the API
validates a team's policy, the Trainer and the LCM carry it, and the
controller enforces it (services/common/relay.py: the local sandbox and the docker backend relay
what it allows).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

STORE = "store"
NONE = "none"
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
                   r"[A-Za-z0-9])?)*$")


@dataclass(frozen=True)
class Policy:
    store: bool = False
    hosts: tuple[tuple[str, int], ...] = ()  # sorted, unique (host lower-cased)

    def __str__(self) -> str:
        items = ([STORE] if self.store else []) + [f"{h}:{p}" for h, p in self.hosts]
        return ",".join(items) or NONE

    @property
    def none(self) -> bool:
        return not self.store and not self.hosts


def _destination(item: str, what: str) -> tuple[str, int]:
    host, sep, port = item.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{what}: {item!r} is neither `store` nor host:port")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{what}: {item!r} has no port between 1 and 65535")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if not _HOST.match(host):
            raise ValueError(f"{what}: {item!r}: {host!r} is not a host name or an IPv4 address") from None
        return host.lower(), int(port)
    if ip.version != 4:
        raise ValueError(f"{what}: {item!r}: only IPv4 addresses are supported")
    return str(ip), int(port)


def parse(text: str, what: str = "egress policy") -> Policy:
    """A policy from its text; ValueError naming the item that is wrong. '' and 'none' are none."""
    items = [i.strip() for i in text.split(",") if i.strip()]
    if items == [NONE] or not items:
        return Policy()
    if NONE in items:
        raise ValueError(f"{what}: `none` cannot be combined with other items ({text!r})")
    store = STORE in items
    hosts = sorted({_destination(i, what) for i in items if i != STORE})
    return Policy(store=store, hosts=tuple(hosts))


def effective(admin: Policy, team: Policy | None) -> Policy:
    """The admin's policy narrowed by the team's (None: the team has none of its own)."""
    if team is None:
        return admin
    return Policy(store=admin.store and team.store, hosts=tuple(h for h in team.hosts if h in admin.hosts))

"""Where the platform may send a request for a tenant: the rule for webhook destinations.

A webhook is a POST the Trainer makes from inside the platform's network, to
a URL a tenant chose. So a destination may not be a loopback address
(127.0.0.0/8, ::1), a link-local one (169.254.0.0/16 with the cloud metadata
address, fe80::/10), an unspecified one (0.0.0.0/8, ::), a multicast or
broadcast one, nor one of the platform's own services (the API, the Trainer,
the LCM, etcd, MongoDB, the log store, the S3 endpoint, the metrics ports: the
host:port pairs the settings know) - unless the admin allows it with
TF_WEBHOOK_ALLOW:

    TF_WEBHOOK_ALLOW=hooks.internal,127.0.0.1:9000,10.1.0.0/16,[fd00::/8]:443

a comma-separated list of items, each a host name, an IPv4 address or CIDR,
or a bracketed IPv6 address or CIDR, with an optional `:port`. A name item
matches the URL's host name as written; an address or CIDR item matches the
address the name resolved to. An item without a port allows every port of
what it matches, except the platform's own services: those need an item with
their port (so allowing 127.0.0.1 for a local receiver does not open the
API on 127.0.0.1:8080).

The rule holds for the URL as written (literal addresses and names) when a
team sets its default webhook and when a job is submitted, and again at
each delivery for every address the name resolves to then: the delivery
resolves once, checks, and connects to the address it checked (`Target`),
with the name in the Host header and TLS SNI, so a name that resolves
elsewhere a moment later (DNS rebinding) changes nothing.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from trainforge_services.common.errors import RefusedReference

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Net = ipaddress.IPv4Network | ipaddress.IPv6Network
# host, port -> the addresses it resolves to (raises OSError when it does not resolve)
Resolver = Callable[[str, int], list[str]]

LOOPBACK = "a loopback address"
LINK_LOCAL = "a link-local address (such as the cloud metadata service)"
UNSPECIFIED = "an unspecified address"
NOT_UNICAST = "a multicast or broadcast address"
OWN_SERVICE = "one of the platform's own services"
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_][A-Za-z0-9_-]{0,62})*\.?$")
_UNSPECIFIED_V4 = ipaddress.ip_network("0.0.0.0/8")


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class AllowItem:
    name: str | None = None  # a host name, lower-cased
    net: Net | None = None
    port: int | None = None

    def matches(self, name: str, ip: IP | None, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.name is not None:
            return self.name == name
        return ip is not None and self.net is not None and ip.version == self.net.version and ip in self.net

    def __str__(self) -> str:
        host = self.name or (str(self.net) if self.net.version == 4 else f"[{self.net}]")
        return host if self.port is None else f"{host}:{self.port}"


def _port(text: str, item: str, what: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{what}: {item!r} has no port between 1 and 65535")
    return int(text)


def parse_allow(text: str, what: str = "TF_WEBHOOK_ALLOW") -> tuple[AllowItem, ...]:
    """The allow-list from its text ('' allows nothing); ValueError naming the item that is wrong."""
    items = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        port: int | None = None
        if item.startswith("["):
            host, sep, rest = item[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                raise ValueError(f"{what}: {item!r}: an IPv6 item is [address] or [address/prefix], then :port")
            if rest:
                port = _port(rest[1:], item, what)
        else:
            host, sep, rest = item.partition(":")
            if sep:
                port = _port(rest, item, what)
        try:
            items.append(AllowItem(net=ipaddress.ip_network(host, strict=False), port=port))
            continue
        except ValueError:
            pass
        if item.startswith("[") or "/" in host or not _HOST.match(host):
            raise ValueError(f"{what}: {item!r}: {host!r} is not a host name, an address or a CIDR")
        items.append(AllowItem(name=host.lower().rstrip("."), port=port))
    return tuple(items)


def _address(text: str) -> IP | None:
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])  # fe80::1%eth0: the zone is not part of the address
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped or ip


def address_rule(ip: IP) -> str | None:
    """Which class of never-reachable address `ip` is in (None: an ordinary unicast address)."""
    if ip.is_loopback:
        return LOOPBACK
    if ip.is_link_local:
        return LINK_LOCAL
    if ip.is_unspecified or (ip.version == 4 and ip in _UNSPECIFIED_V4):
        return UNSPECIFIED
    if ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        return NOT_UNICAST
    return None


def endpoints(addresses: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """(host, port) of each address the settings name: `host:port` lists and URLs (mongodb://a:1,b:2/db)."""
    out: list[tuple[str, int]] = []
    defaults = {"http": 80, "https": 443, "mongodb": 27017, "s3": 443}
    for address in addresses:
        if not address:
            continue
        scheme, sep, rest = address.partition("://")
        if scheme.endswith("+unix") or rest[:3].lower() == "%2f":  # a unix socket (the embedded stack's stores)
            continue
        hosts = rest.split("/", 1)[0].rsplit("@", 1)[-1] if sep else address
        for hostport in hosts.split(","):
            hostport = hostport.strip()
            if hostport.startswith("["):
                host, _, port = hostport[1:].partition("]")
                port = port.removeprefix(":")
            else:
                host, _, port = hostport.rpartition(":") if hostport.count(":") == 1 else (hostport, "", "")
            default = defaults.get(scheme.lower()) if sep else None
            number = int(port) if port.isdigit() else default
            if host and number:
                out.append((host.lower().rstrip("."), number))
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class Target:
    """A checked destination: connect to `ip` (never resolve `host` again), say `host` in Host and SNI."""

    url: str
    scheme: str
    host: str
    port: int
    ip: str

    @property
    def connect_url(self) -> str:
        """The URL with its host replaced by the checked address."""
        parts = urlsplit(self.url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = (f"{userinfo}@" if userinfo else "") + (f"[{self.ip}]" if ":" in self.ip else self.ip) + f":{self.port}"
        return parts._replace(netloc=netloc).geturl()

    @property
    def host_header(self) -> str:
        default = {"http": 80, "https": 443}[self.scheme]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def policy(allow: str, service_addresses: Iterable[str], *, resolve: Resolver = system_resolver) -> WebhookPolicy:
    """The policy of a service's settings: TF_WEBHOOK_ALLOW and the addresses of the platform's services."""
    return WebhookPolicy(parse_allow(allow), endpoints(service_addresses), resolve=resolve)


class WebhookPolicy:
    """The destination rule with the admin's allow-list and the platform's own endpoints."""

    def __init__(self, allow: Iterable[AllowItem] = (), own: Iterable[tuple[str, int]] = (), *,
                 resolve: Resolver = system_resolver):
        self.allow = tuple(allow)
        self.own = tuple(own)
        self._resolve = resolve
        self._own_addresses: set[tuple[IP, int]] | None = None
        self._local_addresses: set[IP] | None = None

    # -- what the platform is ------------------------------------------------------------------

    def _own(self) -> set[tuple[IP, int]]:
        """The own endpoints' addresses, resolved once (a name that does not resolve is matched by name)."""
        if self._own_addresses is None:
            found: set[tuple[IP, int]] = set()
            for host, port in self.own:
                ip = _address(host)
                if ip is not None:
                    found.add((ip, port))
                    continue
                try:
                    found.update((a, port) for a in map(_address, self._resolve(host, port)) if a is not None)
                except OSError:
                    pass
            self._own_addresses = found
        return self._own_addresses

    def _local(self) -> set[IP]:
        """This machine's addresses: where a service listening on 0.0.0.0 or :: is reached."""
        if self._local_addresses is None:
            try:
                found = {_address(a) for a in self._resolve(socket.gethostname(), 0)}
            except OSError:
                found = set()
            self._local_addresses = {a for a in found if a is not None}
        return self._local_addresses

    def _is_own(self, name: str, ip: IP | None, port: int) -> bool:
        if (name, port) in self.own:
            return True
        if ip is None:
            return False
        own = self._own()
        if (ip, port) in own:
            return True
        return any(a.is_unspecified and p == port for a, p in own) and ip in self._local()

    # -- the rule ------------------------------------------------------------------------------

    def rule_broken(self, name: str, ip: IP | None, port: int) -> str | None:
        """The rule a destination breaks (None: it may be sent to), the allow-list applied."""
        allowed = [item for item in self.allow if item.matches(name, ip, port)]
        if self._is_own(name, ip, port):
            return None if any(item.port is not None for item in allowed) else OWN_SERVICE
        rule = address_rule(ip) if ip is not None else None
        if rule is None and (name in ("localhost", "localhost.localdomain") or name.endswith(".localhost")):
            rule = LOOPBACK
        return None if rule is None or allowed else rule

    def _split(self, url: str, field: str) -> tuple[str, str, int]:
        try:
            parts = urlsplit(url)
            scheme, host, port = parts.scheme.lower(), (parts.hostname or "").rstrip("."), parts.port
        except ValueError:
            scheme, host, port = "", "", None
        if scheme not in ("http", "https") or not host:
            raise _refused(field, url, "not an http:// or https:// URL with a host")
        if _address(host) is None and not _HOST.match(host):  # e.g. a label over 63 characters: no resolver takes it
            raise _refused(field, url, "its host is not a valid host name or address")
        return scheme, host.lower(), port or (443 if scheme == "https" else 80)

    def check_url(self, url: str, field: str = "webhook") -> str:
        """`url` if it may be a webhook; RefusedReference naming the field and the rule. A literal address and
        the name as written are checked, and every address the name resolves to now (a name that does not
        resolve is left to the delivery, which checks again)."""
        scheme, host, port = self._split(url, field)
        ip = _address(host)
        addresses: list[IP | None] = [ip]
        if ip is None:
            try:
                addresses = [a for a in map(_address, self._resolve(host, port)) if a is not None] or [None]
            except OSError:
                addresses = [None]
        for address in addresses:
            rule = self.rule_broken(host, address, port)
            if rule is not None:
                raise _refused(field, url, _saying(host, address, port, rule))
        return url

    def target(self, url: str) -> Target:
        """The address to deliver to: `url`'s host resolved once, every address it has checked; RefusedReference
        when one breaks the rule, OSError when the name does not resolve (try again later)."""
        scheme, host, port = self._split(url, "webhook")
        ip = _address(host)
        resolved = [ip] if ip is not None else [a for a in map(_address, self._resolve(host, port)) if a is not None]
        if not resolved:
            raise OSError(f"{host} has no address")
        for address in resolved:
            rule = self.rule_broken(host, address, port)
            if rule is not None:
                raise _refused("webhook", url, _saying(host, address, port, rule))
        return Target(url, scheme, host, port, str(resolved[0]))


def _saying(host: str, ip: IP | None, port: int, rule: str) -> str:
    where = f"{host}:{port}" if ip is None or str(ip) == host else f"{host}:{port} (resolves to {ip})"
    return f"{where} is {rule}; TF_WEBHOOK_ALLOW may allow it"


def _refused(field: str, url: str, rule: str) -> RefusedReference:
    message = f"{field}: {rule}"
    return RefusedReference(message, refusals=[{"field": field, "source": url[:300], "rule": rule}],
                            details=[{"field": field, "message": rule}])

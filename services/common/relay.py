"""Egress relays: TCP forwarders, one per allowed destination, listening inside a learner's network namespace.

A learner's network namespace has no route out (the local sandbox's
`tf-<job>` with only loopback; a docker container on an internal network
whose bridge has no host address), so nothing beyond the job is reachable
unless its controller, which runs outside and already does the platform's
talking, relays it. For each destination the policy allows
(trainforge_services.common.egress), a listening socket is opened *inside*
the namespace, by a short-lived thread that entered it with setns(2), and
every connection it accepts is relayed to the real destination from the
host's side. So a destination is reachable at:

- a host name: a loopback address of its own, `127.0.1.<n>` (n by the
  sorted list of names, so every rank of the job agrees), which the
  learner's hosts file maps the name to;
- an IPv4 address: the same address, added to the namespace's loopback
  (`127.0.0.1:<port>` is the namespace's own loopback, relayed to the
  host's);
- `store`: the object store's S3 endpoint, as above by its host, and
  `AWS_ENDPOINT_URL` in the learner's environment names it (no credentials:
  the learner reaches the endpoint, not the platform's buckets).

Only the listed ports listen; every other address and port still refuses
or has no route. Listeners bind with SO_REUSEPORT, so the ranks of one job
that share a namespace each run the same forwarders and one controller
ending does not cut the others' learners off. Used by the local sandbox
(services/controller/sandbox/egress.py) and the docker backend's runner.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import os
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from trainforge_services.common.egress import Policy

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
NAME_NET = ipaddress.ip_network("127.0.1.0/24")
CONNECT_TIMEOUT = 10.0
HOSTS_HEADER = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
_libc = ctypes.CDLL(None, use_errno=True)


def store_destination(endpoint: str) -> tuple[str, int] | None:
    """(host, port) of an S3 endpoint URL; None when there is none to reach (files, or AWS's default)."""
    if not endpoint:
        return None
    url = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if not url.hostname:
        return None
    return url.hostname.lower(), url.port or (443 if url.scheme == "https" else 80)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
        return True
    except ValueError:
        return False


def plan(policy: Policy, store_endpoint: str) -> tuple[list[tuple[str, int, str]], dict[str, str], list[str]]:
    """([(listen address, port, destination host)], {name: address} for the hosts file, notes for the log)."""
    dests = list(policy.hosts)
    notes = []
    if policy.store:
        store = store_destination(store_endpoint)
        if store is None:
            notes.append("egress `store`: the object store has no S3 endpoint to reach (local files or the "
                         "provider's default), so nothing is forwarded for it")
        elif store not in dests:
            dests.append(store)
    names = sorted({h for h, _ in dests if not _is_ip(h) and h != "localhost"})
    if len(names) > NAME_NET.num_addresses - 2:
        raise OSError(f"the egress policy names {len(names)} hosts; at most {NAME_NET.num_addresses - 2} fit")
    addrs = {name: str(NAME_NET.network_address + i + 1) for i, name in enumerate(names)}
    addrs["localhost"] = "127.0.0.1"
    return [(h if _is_ip(h) else addrs[h], p, h) for h, p in sorted(dests)], \
        {n: a for n, a in addrs.items() if n != "localhost"}, notes


def hosts_file(names: dict[str, str]) -> str:
    return HOSTS_HEADER + "".join(f"{addr}\t{name}\n" for name, addr in sorted(names.items()))


def egress_env(policy: Policy, store_endpoint: str) -> dict[str, str]:
    """What the learner's environment says about its egress: TF_EGRESS, and AWS_ENDPOINT_URL for `store`."""
    out = {"TF_EGRESS": str(policy)}
    if policy.store and store_destination(store_endpoint):
        out["AWS_ENDPOINT_URL"] = out["AWS_ENDPOINT_URL_S3"] = store_endpoint
    return out


def _add_with_ip(addr: str) -> None:
    """`ip addr add <addr>/32 dev lo` in the calling thread's network namespace (a child forked from a thread
    keeps that thread's namespaces); one already there is fine."""
    out = subprocess.run(["ip", "addr", "add", f"{addr}/32", "dev", "lo"], capture_output=True, text=True,
                         timeout=10, check=False)
    if out.returncode != 0 and "exists" not in out.stderr:
        raise OSError(f"ip addr add {addr}/32 dev lo failed: {out.stderr.strip() or out.returncode}")


def listen_in(netns_path: Path, addresses: list[tuple[str, int]], *,
              add_addresses: bool = False) -> list[socket.socket]:
    """Listening TCP sockets created inside the namespace (by a thread that joins it and then ends); none, and no
    thread, for no addresses. `add_addresses`: first put each address outside 127/8 on the namespace's loopback."""
    if not addresses:
        return []
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            fd = os.open(netns_path, os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns_path}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
            for addr, port in addresses:
                if add_addresses and not ipaddress.IPv4Address(addr).is_loopback:
                    _add_with_ip(addr)
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                made.append(s)
                s.bind((addr, port))
                s.listen(64)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            failed.append(e)

    # not a Loop: a one-shot thread that joins the job's namespace and ends with it
    t = threading.Thread(target=work, name="egress-netns", daemon=True)
    t.start()
    t.join()
    if failed:
        for s in made:
            s.close()
        raise failed[0] if isinstance(failed[0], OSError) else OSError(str(failed[0]))
    return made


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


class EgressError(Exception):
    """The forwarders the policy asks for could not be set up: the learner must not run (never unsandboxed)."""


class Relays:
    """The forwarders of one learner: `start()` once its namespace exists, `stop()` at cleanup. `listen` makes
    the listening sockets inside the namespace for [(address, port)]."""

    def __init__(self, policy: Policy, store_endpoint: str,
                 listen: Callable[[list[tuple[str, int]]], list[socket.socket]]):
        self.policy, self.store_endpoint, self._listen = policy, store_endpoint, listen
        self.routes, self.names, self.notes = plan(policy, store_endpoint)
        self._listeners: list[socket.socket] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def env(self) -> dict[str, str]:
        return egress_env(self.policy, self.store_endpoint)

    def start(self) -> None:
        try:
            self._listeners = self._listen([(a, p) for a, p, _ in self.routes])
        except OSError as e:
            raise EgressError(f"egress {self.policy}: {e.strerror or e}") from e
        for sock, (addr, port, host) in zip(self._listeners, self.routes, strict=True):
            # not a Loop: blocks in accept() until the listener is closed
            threading.Thread(target=self._accept, args=(sock, host, port), daemon=True,
                             name=f"egress {addr}:{port}").start()
            log.info("egress: %s:%d in the learner's network namespace relays to %s:%d", addr, port, host, port)

    def _accept(self, listener: socket.socket, host: str, port: int) -> None:
        while not self._stopped.is_set():
            try:
                inside, _ = listener.accept()
            except OSError:
                return
            # not a Loop: one connection's relay, a byte pump each way until either side closes
            threading.Thread(target=self._relay, args=(inside, host, port), daemon=True).start()

    def _relay(self, inside: socket.socket, host: str, port: int) -> None:
        try:
            outside = socket.create_connection((host, port), CONNECT_TIMEOUT)
        except OSError as e:
            log.info("egress: %s:%d cannot be reached: %s", host, port, e)
            inside.close()
            return
        with self._lock:
            if self._stopped.is_set():
                inside.close()
                outside.close()
                return
            self._conns |= {inside, outside}
        # not a Loop: a byte pump (outside to inside) while this thread pumps the other way
        back = threading.Thread(target=_pump, args=(outside, inside), daemon=True)
        back.start()
        _pump(inside, outside)
        back.join()
        with self._lock:
            self._conns -= {inside, outside}
        inside.close()
        outside.close()

    def stop(self) -> None:
        self._stopped.set()
        for s in self._listeners:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

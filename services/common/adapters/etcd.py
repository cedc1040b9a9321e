"""etcd behind a small interface: JSON values, leases, transactions, watches.

The only modules that import the etcd client (`pyetcd`, from
etcd-sdk-python) are this one and etcdauth.py (a connection's login, users
and roles). Values are JSON objects. `watch_prefix` hides the two
things that make etcd watches hard to use: a watch that breaks (etcd
restarted) is re-opened from the last revision seen, and a watch whose
revision was compacted away re-lists the prefix and carries on, telling the
caller through a `resync` event so no state change is missed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyetcd
import pyetcd.exceptions as etcd_exc
from pyetcd.utils import prefix_range_end

from trainforge_services.common.adapters import etcdauth
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.keys import Keys
from trainforge_services.common.retry import QUICK

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """One change under a watched prefix.

    kind: "put" | "delete" | "resync". A "resync" event carries in `snapshot`
    the full current contents of the prefix (after a compaction or a
    reconnect that could not resume); the caller replaces its view with it.
    """

    kind: str
    key: str = ""
    value: dict | None = None
    revision: int = 0
    snapshot: dict[str, dict] | None = None


class StopEvent(threading.Event):
    """A stop flag whose `set()` also wakes the watches given it (`Coordinator.watch_prefix(stop=...)`).

    A watch waits on its event queue; with a plain `threading.Event` it notices
    a stop only at its next poll (up to `poll`, 0.5 s). A job monitor joins its
    watch thread on the way out, and the LCM's KillJob waits for the monitor to
    exit, so that poll held every finished job's learner slot for up to 0.5 s.
    `set()` takes only a short lock of its own and puts a marker on each queue.
    """

    def __init__(self) -> None:
        super().__init__()
        self._wakers: list[Callable[[], None]] = []
        self._wakers_lock = threading.Lock()

    def add_waker(self, fn: Callable[[], None]) -> None:
        with self._wakers_lock:
            self._wakers.append(fn)
        if self.is_set():
            fn()

    def remove_waker(self, fn: Callable[[], None]) -> None:
        with self._wakers_lock:
            if fn in self._wakers:
                self._wakers.remove(fn)

    def set(self) -> None:
        super().set()
        with self._wakers_lock:
            wakers = list(self._wakers)
        for fn in wakers:
            fn()


_WAKE = object()  # what a StopEvent puts on a watch's queue


class FenceRefused(Unavailable):
    """A fenced write refused: the election key it is fenced on is no longer its writer's (services/common/
    election.py); the writer was deposed and must stop acting."""


class Lease:
    def __init__(self, raw: Any, ttl: int, call: Callable[..., Any]):
        self._raw = raw
        self.id: int = raw.id
        self.ttl = ttl
        self._call = call  # its connection's `_call`: logged in, errors made clear

    def refresh(self) -> bool:
        """Keep the lease alive; False when it has already expired."""
        try:
            responses = self._call(self._raw.refresh)
        except Unavailable as e:
            raise Unavailable(f"etcd lease refresh failed: {e}") from None
        return bool(responses) and responses[0].TTL > 0

    def revoke(self) -> None:
        try:
            self._call(self._raw.revoke)
        except Exception:  # noqa: BLE001 - it lapses on its own
            log.warning("could not revoke lease %x", self.id)


def _decode(raw: bytes | None) -> dict | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return {"raw": raw.decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


class Coordinator:
    """A connection to etcd scoped to trainforge's key prefix, logged in as `user` when given one."""

    def __init__(self, endpoints: str, prefix: str = "/trainforge", timeout: float = 5.0, *, user: str = "",
                 password: str = ""):
        host, _, port = endpoints.split(",")[0].strip().rpartition(":")
        self._host, self._port, self._timeout = host or "127.0.0.1", int(port), timeout
        self.keys = Keys(prefix.rstrip("/"))
        self.session = etcdauth.Session(user, password, f"{self._host}:{self._port}")
        self._client = pyetcd.client(host=self._host, port=self._port, timeout=timeout)
        # The client marks an endpoint dead for 5 minutes after one error; an
        # etcd restart must be noticed within a second instead.
        for endpoint in self._client.endpoints.values():
            endpoint.time_retry = 0.5

    @classmethod
    def of(cls, settings: Any) -> Coordinator:
        """The connection `settings` (StoreSettings) name: endpoints, prefix, and user and password if any."""
        return cls(settings.etcd_endpoints, settings.etcd_prefix, user=settings.etcd_user,
                   password=settings.etcd_password)

    def close(self) -> None:
        self._client.close()

    # -- plain reads and writes -------------------------------------------------

    def _call(self, fn, *args, _key: str = "", **kwargs):
        """fn(*args, **kwargs) logged in, its failures made clear (`etcdauth.call`); `_key` names what it touches."""
        return etcdauth.call(self.session, self._client, functools.partial(fn, *args, **kwargs), _key)

    def login(self) -> bool:
        """Log in now (Unauthenticated when etcd refuses the user); whether etcd has authentication on."""
        self._call(lambda: None)
        return self.session.token != "-" if self.session.user else False

    def admin(self) -> etcdauth.Admin:
        """Users and roles, through this connection (its user needs etcd's root role)."""
        def call(method: str, request: Any) -> Any:  # the stub itself: its token read once logged in
            return self._call(lambda: getattr(self._client.authstub, method)(request, self._timeout,
                                                                             metadata=self._client.metadata))
        return etcdauth.Admin(call)

    def healthy(self) -> bool:
        try:
            self._client.status()
            return True
        except Exception:  # noqa: BLE001 - any failure means "not healthy"
            return False

    def fenced(self, key: str, create_revision: int, on_refused: Callable[[], None] = lambda: None) -> Coordinator:
        """This connection, with every write made only while `key` still has `create_revision` (a leader's
        election key and term): see `FencedCoordinator`."""
        return FencedCoordinator(self, key, create_revision, on_refused)

    def confirm(self) -> None:
        """Nothing for an unfenced connection; a fenced one raises `FenceRefused` once its fence fell."""

    def _write(self, op, compare: list | None = None, key: str = "") -> bool:  # noqa: ANN001 - a pyetcd op
        """One write (or a list of them, made together), under `compare` when given: whether it was made."""
        ops = op if isinstance(op, list) else [op]
        ok, _ = self._call(self._client.transaction, compare=compare or [], success=ops, failure=[], _key=key)
        return bool(ok)

    def put(self, key: str, value: dict, lease: Lease | None = None) -> None:
        self._write(self._client.transactions.put(key, json.dumps(value), lease=lease.id if lease else None), key=key)

    def get(self, key: str) -> tuple[dict | None, int]:
        """(value, mod_revision); (None, 0) when absent."""
        raw, meta = self._call(self._client.get, key, _key=key)
        return _decode(raw), (meta.mod_revision if meta else 0)

    def list(self, prefix: str) -> tuple[dict[str, dict], int]:
        """All keys under prefix and the store revision they were read at."""
        resp = self._call(self._client.get_prefix_response, prefix, _key=prefix)
        out = {kv.key.decode(): _decode(kv.value) or {} for kv in resp.kvs}
        return out, resp.header.revision

    def create(self, key: str, value: dict, lease: Lease | None = None) -> bool:
        """Put only if the key does not exist; True when this call created it."""
        t = self._client.transactions
        return self._write(t.put(key, json.dumps(value), lease=lease.id if lease else None), [t.create(key) == 0],
                           key)

    def replace(self, key: str, expected_mod_revision: int, value: dict, lease: Lease | None = None) -> bool:
        """Compare-and-swap on the key's mod revision (0: must not exist)."""
        t = self._client.transactions
        return self._write(t.put(key, json.dumps(value), lease=lease.id if lease else None),
                           [t.mod(key) == expected_mod_revision], key)

    def delete(self, key: str) -> None:
        self._write(self._client.transactions.delete(key), key=key)

    def delete_prefix(self, prefix: str, *, put: tuple[str, dict] | None = None, lease: Lease | None = None) -> None:
        """Delete every key under `prefix`; with `put` (a key outside it and its value, under `lease` when given),
        write that key in the same transaction: a reader sees both or neither."""
        t = self._client.transactions
        ops = [t.delete(prefix, range_end=prefix_range_end(prefix.encode()))]
        if put is not None:
            ops.append(t.put(put[0], json.dumps(put[1]), lease=lease.id if lease else None))
        self._write(ops, key=prefix)

    def grant_lease(self, ttl: int) -> Lease:
        return Lease(self._call(self._client.lease, ttl), ttl, self._call)

    # -- watches ----------------------------------------------------------------

    def watch_prefix(self, prefix: str, start_revision: int | None = None,
                     stop: threading.Event | None = None, poll: float = 0.5) -> Iterator[Event]:
        """Events under prefix from start_revision on, forever (until `stop` is set).

        With start_revision None, begins with a "resync" event holding the
        current contents. Survives etcd restarts and compaction (see module doc).
        """
        stop = stop or threading.Event()
        next_rev = start_revision
        # QUICK's waits, but never past `poll`, so a restarted etcd is found again within a poll.
        backoff = QUICK.backoff()

        def pause() -> None:
            stop.wait(min(backoff.next(), poll))

        while not stop.is_set():
            if next_rev is None:
                try:
                    snapshot, rev = self.list(prefix)
                except Unavailable:
                    pause()
                    continue
                backoff.reset()
                yield Event("resync", revision=rev, snapshot=snapshot)
                next_rev = rev + 1
            try:  # logged in, with a watch stream that carries the current token (`_probe`)
                generation = self._probe(prefix, reset=True)
            except Unavailable:
                pause()
                continue
            q: queue.Queue = queue.Queue()
            try:
                watch_id = self._client.add_watch_prefix_callback(prefix, q.put, start_revision=next_rev)
            except etcd_exc.RevisionCompactedError:
                next_rev = None
                continue
            except Exception as e:  # noqa: BLE001 - etcd down: retry after a pause
                log.debug("watch on %s failed to open: %s", prefix, e)
                self._reset_watcher()
                pause()
                continue
            if self.session.user and self._probe(prefix, quiet=True) != generation:
                # the token lapsed as the watch opened, which etcd answers with a silent cancel: open it again
                with contextlib.suppress(Exception):
                    self._client.cancel_watch(watch_id)
                continue
            wake = functools.partial(q.put, _WAKE)
            if isinstance(stop, StopEvent):
                stop.add_waker(wake)
            try:
                while not stop.is_set():
                    try:
                        item = q.get(timeout=poll)
                    except queue.Empty:
                        continue
                    if item is _WAKE:
                        continue
                    if isinstance(item, etcd_exc.RevisionCompactedError):
                        next_rev = None
                        break
                    if isinstance(item, Exception):
                        log.debug("watch on %s broke: %s; resuming from %s", prefix, item, next_rev)
                        self._reset_watcher()
                        pause()
                        break
                    backoff.reset()
                    for ev in item.events:
                        kind = "delete" if isinstance(ev, pyetcd.events.DeleteEvent) else "put"
                        rev = ev.mod_revision
                        yield Event(kind, ev.key.decode(), None if kind == "delete" else _decode(ev.value), rev)
                        next_rev = max(next_rev or 0, rev + 1)
                    if item.header.revision:
                        next_rev = max(next_rev or 0, item.header.revision + 1)
            finally:
                if isinstance(stop, StopEvent):
                    stop.remove_waker(wake)
                try:
                    self._client.cancel_watch(watch_id)
                except Exception:  # noqa: BLE001 - the watch may already be gone
                    pass

    def _probe(self, prefix: str, *, reset: bool = False, quiet: bool = False) -> int:
        """With auth on, a read of `prefix` (etcd cancels a watch it may not read silently: PermissionDenied comes
        from here; `quiet`: -1 if it fails); the token's generation. `reset`: a stream with an older token is reset."""
        if self.session.user:
            try:
                self._call(self._client.get_prefix_response, prefix, keys_only=True, limit=1, _key=prefix)
            except Unavailable:
                if not quiet:
                    raise
                return -1
        if reset and self.session.watch_generation != self.session.generation:
            self.session.watch_generation = self.session.generation
            self._reset_watcher()
        return self.session.generation

    def _reset_watcher(self) -> None:
        # The client's watcher thread dies with its stream; a fresh one is made lazily.
        try:
            self._client.watcher.close()
        except Exception:  # noqa: BLE001
            pass
        try:
            self._client._clear_old_stubs()  # noqa: SLF001 - no public way to reconnect
        except Exception:  # noqa: BLE001
            pass


class FencedCoordinator(Coordinator):
    """A leader's view of etcd: every write is one transaction that also compares the leader's election key
    with the create revision it had when this replica was elected (its term).

    While the key is the one this replica created, the writes go through; once its lease expired (a
    paused leader resumed, a partition) and the key is gone or another replica's, every write is refused
    with `FenceRefused`, `on_refused` is called once (the replica gives up leading), and nothing is
    written: a deposed leader cannot overwrite what its successor wrote. Reads are not fenced. It shares
    its parent's connection; `close` leaves that open.
    """

    def __init__(self, parent: Coordinator, key: str, create_revision: int, on_refused: Callable[[], None]):
        self.__dict__.update(parent.__dict__)
        self.fence_key, self.term = key, create_revision
        self._on_refused = on_refused
        self._refused = False

    def close(self) -> None:
        pass  # the parent's connection

    def confirm(self) -> None:
        """Raise `FenceRefused` when the election key is no longer this leader's (a read of one key)."""
        if self._refused:
            self._refuse()
        raw, meta = self._call(self._client.get, self.fence_key)
        if raw is None or meta is None or meta.create_revision != self.term:
            self._refuse()

    def _write(self, op, compare: list | None = None, key: str = "") -> bool:  # noqa: ANN001 - a pyetcd op
        if self._refused:
            self._refuse()
        t = self._client.transactions
        ours = t.create(self.fence_key) == self.term
        ops = op if isinstance(op, list) else [op]
        if compare is None:
            ok, _ = self._call(self._client.transaction, compare=[ours], success=ops, failure=[], _key=key)
            if not ok:
                self._refuse()
            return True
        # the write's own condition nested under the fence: the outer comparison fails only when the fence fell
        inner = t.txn(compare=compare, success=ops, failure=[])
        ok, responses = self._call(self._client.transaction, compare=[ours], success=[inner], failure=[], _key=key)
        if not ok:
            self._refuse()
        return bool(responses[0].response_txn.succeeded)

    def _refuse(self) -> None:
        first, self._refused = not self._refused, True
        if first:
            log.warning("etcd writes refused: %s (term %d) is no longer this leader's", self.fence_key, self.term)
            self._on_refused()
        raise FenceRefused(f"this replica's leadership (term {self.term}) was taken over: {self.fence_key} is "
                           "no longer its key, so it writes nothing more")


def wait_healthy(coord: Coordinator, timeout: float) -> None:
    def check() -> None:
        if not coord.healthy():
            raise Unavailable("etcd did not become healthy in time")

    QUICK.within(deadline=timeout).call(check, retry_on=Unavailable)

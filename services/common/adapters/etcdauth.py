"""etcd's authentication: a connection's login, and the platform's users and roles.

With auth enabled, etcd serves a request only with a token, got by
authenticating a user with its password (a bcrypt hash on the server, so
start etcd with a low `--bcrypt-cost`). A `Session` holds one connection's
token: got on first use, and again when etcd says it is no longer valid (it
lapsed after `--auth-token-ttl` seconds unused, etcd restarted). etcd's
refusals become clear errors naming the user, never its password.

`Admin` manages users and roles; it needs a login with etcd's `root` role.
`setup` makes the root user, the services' users and turns auth on, for the
embedded stack, the tests and an operator's first install.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import pyetcd.exceptions as etcd_exc
from pyetcd import etcdrpc
from pyetcd.utils import prefix_range_end

from trainforge_services.common.errors import (
    Conflict,
    NotFound,
    PermissionDenied,
    TrainforgeError,
    Unauthenticated,
    Unavailable,
)

log = logging.getLogger(__name__)

ROOT = "root"
READWRITE = etcdrpc.Permission.READWRITE
SETTINGS_HINT = "etcd_user / etcd_password (TF_ETCD_USER / TF_ETCD_PASSWORD)"


def _details(e: grpc.RpcError) -> str:
    return (e.details() if hasattr(e, "details") else "") or ""


def renews(e: grpc.RpcError) -> bool:
    """Whether etcd refused the request's token (lapsed, etcd restarted, the user's tokens revoked)."""
    return e.code() == grpc.StatusCode.UNAUTHENTICATED and "invalid auth token" in _details(e)


def stale(e: grpc.RpcError) -> bool:
    """Whether etcd's users or roles changed while it served the request: nothing was done; ask again."""
    return e.code() == grpc.StatusCode.INVALID_ARGUMENT and "auth store is old" in _details(e)


class Session:
    """The login of one etcd connection (shared by a connection and its fenced views)."""

    def __init__(self, user: str, password: str, where: str):
        if bool(user) != bool(password):
            raise ValueError(f"etcd at {where}: {SETTINGS_HINT} must be given together "
                             f"({'a user without a password' if user else 'a password without a user'})")
        self.user, self._password, self.where = user, password, where
        self._lock = threading.Lock()
        self.token = ""
        self.generation = 0  # how many tokens this session got: a watch stream opened with an older one is reset
        self.watch_generation = 0

    def __repr__(self) -> str:
        return f"Session(user={self.user!r}, where={self.where!r})"

    def ensure(self, client: Any) -> None:
        """Log in once, before the first request."""
        if self.user and not self.token:
            self.renew(client, self.generation)

    def renew(self, client: Any, seen: int) -> None:
        """A fresh token, unless another thread got one since generation `seen`."""
        with self._lock:
            if self.generation != seen and self.token:
                return
            try:
                resp = client.authstub.Authenticate(
                    etcdrpc.AuthenticateRequest(name=self.user, password=self._password), client.timeout)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT and "authentication failed" in _details(e):
                    raise Unauthenticated(f"etcd at {self.where} refused user {self.user!r}: wrong password or no "
                                          f"such user (check {SETTINGS_HINT})") from None
                if "authentication is not enabled" in _details(e):
                    log.warning("etcd at %s has authentication off; user %r is not needed", self.where, self.user)
                    self.token = "-"
                    return
                raise Unavailable(f"etcd at {self.where}: could not log in as {self.user!r}: {_details(e) or e.code()}"
                                  ) from None
            self.token = resp.token
            self.generation += 1
            # the token goes as plain metadata: gRPC sends call credentials over TLS channels only
            client.metadata = (("token", resp.token),)
            client.call_credentials = None


def refusal(e: grpc.RpcError, session: Session, key: str = "") -> TrainforgeError | None:
    """The clear error for etcd refusing a request of `session` (on `key`), or None for other failures."""
    code, details = e.code(), _details(e)
    who = f"user {session.user!r}" if session.user else "a client without a user"
    on = f" on {key}" if key else ""
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"etcd at {session.where} refused {who}{on}: permission denied")
    if code == grpc.StatusCode.INVALID_ARGUMENT and "user name is empty" in details:
        return Unauthenticated(f"etcd at {session.where} has authentication on: set {SETTINGS_HINT}")
    if code == grpc.StatusCode.FAILED_PRECONDITION and "already exist" in details:
        return Conflict(f"etcd at {session.where}: {details.removeprefix('etcdserver: ')}")
    if code == grpc.StatusCode.FAILED_PRECONDITION and "not found" in details:
        return NotFound(f"etcd at {session.where}: {details.removeprefix('etcdserver: ')}")
    return None


def call(session: Session, client: Any, fn: Callable[[], Any], key: str = "") -> Any:
    """fn() on `client` logged in as `session`: a refused token is renewed and fn called again, as is a request
    etcd turned down while its users changed; etcd's refusals become PermissionDenied/Unauthenticated naming the
    user (and `key`), every other failure Unavailable."""
    for tries_left in (2, 1, 0):
        seen = session.generation
        try:
            session.ensure(client)
            return fn()
        except grpc.RpcError as e:
            if tries_left and renews(e):
                session.renew(client, seen)
                continue
            if tries_left and stale(e):
                continue
            refused = refusal(e, session, key)
            if refused is not None:
                raise refused from None
            raise Unavailable(f"etcd at {session.where} unavailable: {e}") from None
        except (etcd_exc.ConnectionFailedError, etcd_exc.ConnectionTimeoutError, etcd_exc.InternalServerError,
                etcd_exc.NoServerAvailableError, ValueError) as e:
            raise Unavailable(f"etcd at {session.where} unavailable: {e}") from None
    raise AssertionError("unreachable")


def principal(prefix: str, name: str) -> str:
    """The etcd user (and role) of `name` under the platform's key prefix: '/trainforge', 'lcm' -> 'trainforge-lcm'.

    Several platforms (or test stacks) may share one etcd under different prefixes; their users differ too.
    """
    return f"{prefix.strip('/').replace('/', '-') or 'trainforge'}-{name}"


class Admin:
    """Users and roles, through a connection logged in with etcd's root role (`Coordinator.admin()`)."""

    def __init__(self, call: Any):
        self._call = call  # (method name of etcd's Auth service, request) -> response

    def ensure_user(self, user: str, password: str) -> None:
        """The user with this password (made, or its password set again)."""
        try:
            self._call("UserAdd", etcdrpc.AuthUserAddRequest(name=user, password=password))
        except Conflict:
            self._call("UserChangePassword", etcdrpc.AuthUserChangePasswordRequest(name=user, password=password))

    def ensure_role(self, role: str, prefixes: Iterable[str] = ()) -> None:
        """The role, allowed to read and write every key under each of `prefixes`."""
        try:
            self._call("RoleAdd", etcdrpc.AuthRoleAddRequest(name=role))
        except Conflict:
            pass
        for prefix in prefixes:
            perm = etcdrpc.Permission(permType=READWRITE, key=prefix.encode(),
                                      range_end=prefix_range_end(prefix.encode()))
            self._call("RoleGrantPermission", etcdrpc.AuthRoleGrantPermissionRequest(name=role, perm=perm))

    def grant_role(self, user: str, role: str) -> None:
        self._call("UserGrantRole", etcdrpc.AuthUserGrantRoleRequest(user=user, role=role))

    def delete(self, user: str, role: str = "") -> None:
        """Remove the user (its tokens stop working at once) and its role; either may be gone already."""
        for method, request in (("UserDelete", etcdrpc.AuthUserDeleteRequest(name=user)),
                                ("RoleDelete", etcdrpc.AuthRoleDeleteRequest(role=role))):
            if method == "RoleDelete" and not role:
                continue
            try:
                self._call(method, request)
            except NotFound:
                pass

    def user_exists(self, user: str) -> bool:
        try:
            self._call("UserGet", etcdrpc.AuthUserGetRequest(name=user))
        except NotFound:
            return False
        return True

    def enable(self) -> None:
        self._call("AuthEnable", etcdrpc.AuthEnableRequest())


@dataclass(frozen=True)
class ServiceUser:
    """A service's etcd login: its user, password, and the key prefixes it reads and writes (or the root role)."""

    user: str
    password: str
    prefixes: tuple[str, ...] = ()
    root: bool = False


def setup(admin: Admin, root_password: str, users: Iterable[ServiceUser], *, enabled: bool) -> None:
    """The root user, each service's user and role, then auth on (`enabled`: it is on already). Idempotent."""
    if not enabled:
        admin.ensure_user(ROOT, root_password)
        admin.ensure_role(ROOT)
        admin.grant_role(ROOT, ROOT)
    for u in users:
        admin.ensure_user(u.user, u.password)
        role = ROOT if u.root else u.user
        if not u.root:
            admin.ensure_role(role, u.prefixes)
        admin.grant_role(u.user, role)
    if not enabled:
        admin.enable()

"""Teams and API keys, kept in MongoDB so every API replica sees the same callers.

A key is shown to its owner once and never stored: the store keeps its
SHA-256 and its lookup prefix. Keys look like `tf_<prefix>_<secret>`; the
8-hex-digit prefix finds the record (and doubles as the key's public id, the
"actor" in job histories), the secret (256 bits from `secrets`) is checked
with a constant-time comparison. An unknown prefix costs the same comparison
against a dummy hash, so timing does not tell which prefixes exist.

There are no user accounts and no passwords: a person or a machine is known
by the keys issued to them (a key's `name` says whose it is), and a key's
role says what it may do. Every request is authenticated; what a full check
of a key found (its record and its team's read from the store) may be reused
for at most `cache_seconds` (≤ 1 s, `authcache.py`), so a revoked key or a
disabled team is refused within that bound (at once through this process),
and an expired key from its expiry on. With `cache_seconds=0` every request
reads both records afresh.

A disabled team's keys (and tokens) are answered 401, exactly like revoked
keys: the credentials no longer open anything until the team is enabled.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from trainforge_services.api.authcache import AuthCache
from trainforge_services.common.adapters import mongo
from trainforge_services.common.adapters.mongo import Database, DuplicateKeyError, PyMongoError
from trainforge_services.common.errors import Conflict, InvalidArgument, NotFound, Unauthenticated

KEY_PREFIX = "tf_"
KEY_ID = re.compile(r"^[0-9a-f]{8}$")
TEAM_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_KEY = re.compile(r"^tf_([0-9a-f]{8})_([A-Za-z0-9_-]{43,})$")
_DUMMY_HASH = hashlib.sha256(b"no such key").hexdigest()


class Role(enum.StrEnum):
    """What a key may do: members use their team's jobs; team admins also manage the team's
    keys; platform admins also manage every team, quotas, usage and the audit log."""

    MEMBER = "member"
    TEAM_ADMIN = "team_admin"
    PLATFORM_ADMIN = "platform_admin"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def at_least(self, other: Role) -> bool:
        return self.rank >= other.rank


_RANK = {Role.MEMBER: 0, Role.TEAM_ADMIN: 1, Role.PLATFORM_ADMIN: 2}


@dataclass(frozen=True)
class Tenant:
    """The authenticated caller of one request."""

    team: str
    key_id: str
    role: Role
    via: str = "key"  # "key" (an API key) or "jwt" (a token exchanged for one)

    @property
    def actor(self) -> str:
        """How the caller appears in a job's status history."""
        return f"user:{self.key_id}"


def key_id_of(key: str) -> str:
    """The public id (lookup prefix) of a plaintext key."""
    m = _KEY.match(key)
    if not m:
        raise InvalidArgument("not a trainforge API key", details=[{"field": "key", "message": "malformed"}])
    return m.group(1)


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _now() -> float:
    return time.time()


def _unix(t: dt.datetime | float) -> float:
    if isinstance(t, dt.datetime):
        return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()
    return float(t)


def public_key(doc: dict) -> dict:
    """A key record as shown to admins: everything but its hash."""
    return {"key_id": doc["_id"], "team": doc["team"], "name": doc.get("name", ""), "role": doc["role"],
            "created_at": float(doc["created_at"]), "created_by": doc.get("created_by") or "",
            "last_used_at": _opt_float(doc.get("last_used_at")), "expires_at": _opt_float(doc.get("expires_at")),
            "revoked": bool(doc.get("revoked")), "revoked_at": _opt_float(doc.get("revoked_at"))}


def public_team(doc: dict) -> dict:
    return {"name": doc["_id"], "created_at": float(doc.get("created_at") or 0), "disabled": bool(doc.get("disabled")),
            "disabled_at": _opt_float(doc.get("disabled_at"))}


def _opt_float(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]


class IdentityStore:
    """Collections `teams` (_id = team name) and `api_keys` (_id = key prefix).

    Times are unix seconds (floats): the embedded MongoDB-wire server turns a
    datetime written by `$set` into a string, a float survives both servers.
    """

    def __init__(self, db: Database, *, touch_interval: float = 60.0, cache_seconds: float = 0.0):
        self._db = db
        self._cache = AuthCache(cache_seconds)
        self._teams = db["teams"]
        self._keys = db["api_keys"]
        # last_used_at is bookkeeping, not security: writing it on every
        # request would double the store's load for no one's benefit.
        self._touch_interval = touch_interval

    @property
    def db(self) -> Database:
        return self._db

    def ping(self) -> None:
        mongo.ping(self._db)

    def close(self) -> None:
        self._db.client.close()

    # -- teams --------------------------------------------------------------

    def create_team(self, name: str) -> bool:
        """Create a team; False when it already exists (idempotent)."""
        if not isinstance(name, str) or not TEAM_NAME.match(name):
            raise InvalidArgument(
                f"invalid team name {name!r}",
                details=[{"field": "team", "message": "1-63 lowercase letters, digits or '-'"}])
        try:
            result = self._teams.update_one({"_id": name}, {"$setOnInsert": {"created_at": _now(), "disabled": False}},
                                            upsert=True)
        except PyMongoError as e:
            raise mongo.translate(e, "identity store") from None
        return result.upserted_id is not None

    def get_team(self, name: str) -> dict | None:
        try:
            return self._teams.find_one({"_id": name})
        except PyMongoError as e:
            raise mongo.translate(e, "identity store") from None

    def team(self, name: str) -> dict:
        """A team as shown to admins; NotFound when there is no such team."""
        doc = self.get_team(name)
        if doc is None:
            raise NotFound(f"team {name!r} not found")
        return public_team(doc)

    def list_teams(self) -> list[dict]:
        try:
            docs = list(self._teams.find())
        except PyMongoError as e:
            raise mongo.translate(e, "identity store") from None
        return sorted((public_team(d) for d in docs), key=lambda t: t["name"])

    def set_team_disabled(self, name: str, disabled: bool) -> dict:
        """Disable (or enable again) a team; its keys and tokens are refused from the next request on."""
        update = {"disabled": disabled, "disabled_at": _now() if disabled else None}
        try:
            result = self._teams.update_one({"_id": name}, {"$set": update})
        except PyMongoError as e:
            raise mongo.translate(e, "identity store") from None
        if result.matched_count == 0:
            raise NotFound(f"team {name!r} not found")
        self._cache.drop(team=name)
        return self.team(name)

    # -- keys ---------------------------------------------------------------

    def create_key(self, team: str, name: str, role: Role | str = Role.MEMBER, *,
                   expires_at: dt.datetime | float | None = None, created_by: str = "") -> tuple[str, dict]:
        """Create a key for a team: (plaintext, record). The plaintext cannot be recovered later."""
        role = Role(role)
        doc_team = self.get_team(team)
        if doc_team is None:
            raise NotFound(f"team {team!r} not found")
        if doc_team.get("disabled"):
            raise Conflict(f"team {team!r} is disabled; enable it before issuing keys")
        expires = _unix(expires_at) if expires_at is not None else None
        for _ in range(5):
            key_id = secrets.token_hex(4)
            key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
            doc = {"_id": key_id, "hash": _hash(key), "team": team, "name": name, "role": role.value,
                   "created_at": _now(), "created_by": created_by, "last_used_at": None,
                   "expires_at": expires, "revoked": False, "revoked_at": None}
            try:
                self._keys.insert_one(doc)
                return key, public_key(doc)
            except DuplicateKeyError:
                continue
            except PyMongoError as e:
                raise mongo.translate(e, "identity store") from None
        raise Conflict("could not allocate a unique key id; try again")

    def issue_key(self, team: str, name: str, role: Role | str = Role.MEMBER, *,
                  expires_at: dt.datetime | float | None = None) -> str:
        """Create a key for a team and return its plaintext; it cannot be recovered later."""
        return self.create_key(team, name, role, expires_at=expires_at)[0]

    def revoke_key(self, key_id: str, *, team: str | None = None) -> dict:
        """Revoke a key (idempotent); with `team`, another team's key is NotFound like a missing one."""
        query: dict = {"_id": key_id}
        if team is not None:
            query["team"] = team
        try:
            self._keys.update_one({**query, "revoked": {"$ne": True}},
                                  {"$set": {"revoked": True, "revoked_at": _now()}})
            doc = self._keys.find_one(query)
        except PyMongoError as e:
            raise mongo.translate(e, "identity store") from None
        if doc is None:
            raise NotFound(f"API key {key_id} not found")
        self._cache.drop(key_id=key_id)
        return public_key(doc)

    def list_keys(self, team: str) -> list[dict]:
        """A team's keys without their hashes, oldest first."""
        try:
            docs = list(self._keys.find({"team": team}))
        except PyMongoError as e:
            raise mongo.translate(e, "identity store") from None
        return sorted((public_key(d) for d in docs), key=lambda d: d["created_at"])

    # -- authentication -----------------------------------------------------------

    def cached(self, key: str) -> Tenant | None:
        """`authenticate`'s answer when the cache holds one (a full check ≤ the cache's bound ago, key not
        expired since), without touching the store; None when only the store can tell."""
        if not _KEY.match(key or ""):
            raise Unauthenticated("malformed API key; expected tf_<id>_<secret>")
        return self._cache.get(_hash(key))

    def authenticate(self, key: str) -> Tenant:
        """The caller a plaintext key belongs to; Unauthenticated for anything but a live key."""
        m = _KEY.match(key or "")
        if not m:
            raise Unauthenticated("malformed API key; expected tf_<id>_<secret>")
        key_id = m.group(1)
        hashed = _hash(key)
        cached = self._cache.get(hashed)
        if cached is not None:
            return cached
        checked_at = time.monotonic()
        doc = self._find_key(key_id)
        stored = doc["hash"] if doc else _DUMMY_HASH
        if not hmac.compare_digest(hashed, stored) or doc is None:
            raise Unauthenticated("invalid API key")
        tenant = self._live(doc, via="key")
        self._cache.put(hashed, tenant, _opt_float(doc.get("expires_at")), checked_at)
        return tenant

    def cached_tenant_of(self, key_id: str, *, via: str) -> Tenant | None:
        """`tenant_of`'s answer when the cache holds one, without touching the store; else None."""
        return self._cache.get(f"{via}:{key_id}")

    def tenant_of(self, key_id: str, *, via: str) -> Tenant:
        """The caller behind a verified token's key id; Unauthenticated unless that key is still live."""
        token = f"{via}:{key_id}"
        cached = self._cache.get(token)
        if cached is not None:
            return cached
        checked_at = time.monotonic()
        doc = self._find_key(key_id) if KEY_ID.match(key_id or "") else None
        if doc is None:
            raise Unauthenticated("the token's API key does not exist")
        tenant = self._live(doc, via=via)
        self._cache.put(token, tenant, _opt_float(doc.get("expires_at")), checked_at)
        return tenant

    def key_expiry(self, key_id: str) -> float | None:
        doc = self._find_key(key_id)
        return _opt_float(doc.get("expires_at")) if doc else None

    def _find_key(self, key_id: str) -> dict | None:
        try:
            return self._keys.find_one({"_id": key_id})
        except PyMongoError as e:
            raise mongo.translate(e, "identity store") from None

    def _live(self, doc: dict, *, via: str) -> Tenant:
        if doc.get("revoked"):
            raise Unauthenticated("API key revoked")
        now = _now()
        if doc.get("expires_at") and float(doc["expires_at"]) <= now:
            raise Unauthenticated("API key expired")
        team = self.get_team(doc["team"])
        if team is None or team.get("disabled"):
            raise Unauthenticated(f"team {doc['team']} is disabled")
        last = doc.get("last_used_at")
        if last is None or now - float(last) >= self._touch_interval:
            try:
                self._keys.update_one({"_id": doc["_id"]}, {"$set": {"last_used_at": now}})
            except PyMongoError as e:
                raise mongo.translate(e, "identity store") from None
        return Tenant(team=doc["team"], key_id=doc["_id"], role=Role(doc["role"]), via=via)

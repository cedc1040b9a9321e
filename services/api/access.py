"""What admins do to teams, keys and quotas, with the rules about who may do it.

The routes under /v1/team and /v1/admin are thin; the rules that are more
than "which role does the route need" live here: a key's role is never
higher than its issuer's, nor than the role of whoever revokes it, a
platform admin cannot disable their own team (and lock themselves out), and
quotas and usage are only about teams that exist.
"""

from __future__ import annotations

import datetime as dt
import time

from trainforge_services.api.identity import IdentityStore, Role, Tenant
from trainforge_services.api.schemas_quota import QuotaIn
from trainforge_services.api.schemas_teams import KeyIn
from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.common.errors import Conflict, InvalidArgument, PermissionDenied


def issue_key(identity: IdentityStore, caller: Tenant, team: str, body: KeyIn) -> dict:
    """A new key of `team` with its plaintext (shown once) under "key"."""
    role = Role(body.role)
    if not caller.role.at_least(role):
        raise PermissionDenied(f"a {caller.role.value} key cannot issue a {role.value} key")
    expires = unix(body.expires_at, "expires_at")
    if expires is not None and expires <= time.time():
        raise InvalidArgument("expires_at must be in the future",
                              details=[{"field": "expires_at", "message": "must be in the future"}])
    key, record = identity.create_key(team, body.name, role, expires_at=expires, created_by=caller.key_id)
    return {**record, "key": key}


def revoke_key(identity: IdentityStore, caller: Tenant, team: str, key_id: str) -> dict:
    """Revoke one of `team`'s keys; another team's key is NotFound like a missing one, and a key
    of a higher role than the caller's is PermissionDenied."""
    target = next((k for k in identity.list_keys(team) if k["key_id"] == key_id), None)
    if target is not None:
        role = Role(target["role"])
        if not caller.role.at_least(role):
            raise PermissionDenied(f"a {caller.role.value} key cannot revoke a {role.value} key")
    return identity.revoke_key(key_id, team=team)


def create_team(identity: IdentityStore, name: str) -> dict:
    if not identity.create_team(name):
        raise Conflict(f"team {name!r} already exists",
                       details=[{"field": "name", "message": "already exists"}])
    return identity.team(name)


def set_team_disabled(identity: IdentityStore, caller: Tenant, team: str, disabled: bool) -> dict:
    if disabled and team == caller.team:
        raise Conflict("you cannot disable your own team: your key would stop working")
    return identity.set_team_disabled(team, disabled)


def set_quota(identity: IdentityStore, trainer: TrainerApi, caller: Tenant, team: str, body: QuotaIn) -> dict:
    """Replace the team's quota whole (unset limits are removed); the Trainer applies it at its next pass."""
    identity.team(team)
    return trainer.set_quota(team, body.model_dump(), actor=caller.actor)


def team_usage(identity: IdentityStore, trainer: TrainerApi, team: str) -> dict:
    identity.team(team)
    return trainer.team_usage(team)


def unix(t: dt.datetime | float | None, field: str) -> float | None:
    """Unix seconds of a time from a request (UTC when it has no offset)."""
    if t is None or isinstance(t, float | int):
        return t
    try:
        return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()
    except (OverflowError, ValueError, OSError):
        raise InvalidArgument(f"{field}: out of range", details=[{"field": field, "message": "out of range"}]) from None

"""`python -m trainforge_services.api.identity_cli`: manage teams and API keys from a shell on the platform's side.

Day-to-day administration goes over HTTP (/v1/admin, `trainforge admin`);
this is the way in before there is anyone to call it, and the way back when
every admin key is lost: whoever can run it can reach the identity store
anyway, so it needs no credentials. `bootstrap_key` is what the embedded-stack
launcher (`trainforge_services.devstack`) calls in process to get the stack's first key,
and for `trainforge admin bootstrap` the first platform admin's; the
`bootstrap` command prints the plaintext key once and it is not stored anywhere.

    python -m trainforge_services.api.identity_cli bootstrap --team local [--json]
    python -m trainforge_services.api.identity_cli bootstrap --platform-admin --team platform [--json]
    python -m trainforge_services.api.identity_cli issue-key --team ml --name ci --role member [--json]
    python -m trainforge_services.api.identity_cli revoke-key KEY_ID
    python -m trainforge_services.api.identity_cli list-keys --team ml [--json]
    python -m trainforge_services.api.identity_cli enable-team ml
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from pydantic import ValidationError

from trainforge_services.api.identity import IdentityStore, Role, key_id_of
from trainforge_services.common.adapters import mongo
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.settings import ApiSettings


def _store(settings: ApiSettings) -> IdentityStore:
    return IdentityStore(mongo.connect(settings.mongo_url, settings.mongo_db))


def _print_key(args: argparse.Namespace, team: str, key: str, created_team: bool | None = None,
               role: Role | None = None) -> None:
    role = role or Role(getattr(args, "role", Role.MEMBER.value))
    if args.json:
        print(json.dumps({"team": team, "key": key, "key_id": key_id_of(key), "role": role.value}))
        return
    if created_team:
        print(f"created team {team}")
    print(f"{role.value} API key for team {team} (id {key_id_of(key)}); it is shown only this once:")
    print(key)


@dataclass(frozen=True)
class IssuedKey:
    """A key just issued by `bootstrap_key`; `key` is the plaintext, which exists nowhere else."""

    team: str
    key: str
    key_id: str
    role: Role
    created_team: bool

    def to_json(self) -> dict[str, str]:
        return {"team": self.team, "key": self.key, "key_id": self.key_id, "role": self.role.value}


def issue_bootstrap_key(store: IdentityStore, team: str, name: str = "bootstrap", *,
                        platform_admin: bool = False) -> IssuedKey:
    """Create `team` if missing and issue it a team_admin (or platform_admin) key."""
    created = store.create_team(team)
    role = Role.PLATFORM_ADMIN if platform_admin else Role.TEAM_ADMIN
    key = store.issue_key(team, name, role)
    return IssuedKey(team, key, key_id_of(key), role, created)


def bootstrap_key(settings: ApiSettings, team: str, name: str = "bootstrap", *,
                  platform_admin: bool = False) -> IssuedKey:
    """`issue_bootstrap_key` against the identity store `settings` names (the first key of a platform)."""
    store = _store(settings)
    try:
        return issue_bootstrap_key(store, team, name, platform_admin=platform_admin)
    finally:
        store.close()


def bootstrap(store: IdentityStore, args: argparse.Namespace) -> None:
    issued = issue_bootstrap_key(store, args.team, args.name, platform_admin=args.platform_admin)
    _print_key(args, issued.team, issued.key, issued.created_team, issued.role)


def enable_team(store: IdentityStore, args: argparse.Namespace) -> None:
    store.set_team_disabled(args.team, False)
    print(json.dumps({"team": args.team, "disabled": False}) if args.json else f"enabled {args.team}")


def issue_key(store: IdentityStore, args: argparse.Namespace) -> None:
    key = store.issue_key(args.team, args.name, Role(args.role))
    _print_key(args, args.team, key)


def revoke_key(store: IdentityStore, args: argparse.Namespace) -> None:
    store.revoke_key(args.key_id)
    print(json.dumps({"key_id": args.key_id, "revoked": True}) if args.json else f"revoked {args.key_id}")


def list_keys(store: IdentityStore, args: argparse.Namespace) -> None:
    keys = store.list_keys(args.team)
    if args.json:
        print(json.dumps(keys, default=str))
        return
    for k in keys:
        state = "revoked" if k.get("revoked") else "active"
        print(f"{k['key_id']}  {k['role']:<14} {state:<8} {k.get('name', '')}  last used {k.get('last_used_at')}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainforge_services.api.identity_cli", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    def cmd(name: str, fn, help_: str) -> argparse.ArgumentParser:  # noqa: ANN001
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(fn=fn)
        return sp

    b = cmd("bootstrap", bootstrap, "create a team if missing and issue a team_admin (or platform_admin) key")
    b.add_argument("--team", required=True)
    b.add_argument("--name", default="bootstrap", help="label of the key")
    b.add_argument("--platform-admin", action="store_true", help="issue a platform_admin key (the first admin)")
    k = cmd("issue-key", issue_key, "issue a key for an existing team")
    k.add_argument("--team", required=True)
    k.add_argument("--name", required=True, help="label of the key, e.g. who or what uses it")
    k.add_argument("--role", default=Role.MEMBER.value, choices=[r.value for r in Role])
    r = cmd("revoke-key", revoke_key, "revoke a key by its id")
    r.add_argument("key_id")
    ls = cmd("list-keys", list_keys, "list a team's keys (never their secrets)")
    ls.add_argument("--team", required=True)
    en = cmd("enable-team", enable_team, "enable a disabled team again")
    en.add_argument("team")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = ApiSettings()
    except ValidationError as e:
        print(f"error: invalid settings: {e}", file=sys.stderr)
        return 2
    store = _store(settings)
    try:
        args.fn(store, args)
    except TrainforgeError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

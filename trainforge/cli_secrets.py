"""`trainforge secret set|list|delete`: the team's secrets, for a manifest's `env: {VAR: {secret: NAME}}`.

`set` reads the value from stdin when it is piped (`trainforge secret set
wandb < token.txt`) and otherwise prompts for it without echo, so a value
never appears in the command line, the shell history or `ps`.
"""

from __future__ import annotations

import sys

import click
from rich.table import Table

from trainforge import clikit
from trainforge.sdk import ClientError

_TEAM = click.option("--team", help="another team's secrets (needs a platform admin key)")


def _value_from_input() -> str:
    if sys.stdin is not None and not sys.stdin.isatty():
        value = sys.stdin.read()
        # one trailing newline is the file's or echo's, not the secret's
        value = value[:-1] if value.endswith("\n") else value
        value = value[:-1] if value.endswith("\r") else value
    else:
        value = click.prompt("value", hide_input=True, confirmation_prompt=True, err=True)
    if not value:
        raise ClientError("the secret's value is empty")
    return value


@click.group()
def secret() -> None:
    """Team secrets: set (value from stdin or a prompt), list (names only), delete."""


@secret.command("set")
@click.argument("name")
@_TEAM
@clikit.json_flag
@click.pass_context
def set_secret(ctx: click.Context, name: str, team: str | None, as_json: bool) -> None:
    """Create or replace secret NAME; a manifest uses it as `env: {VAR: {secret: NAME}}`."""
    value = _value_from_input()
    saved = clikit.client(ctx, admin=bool(team)).secrets.set(name, value, team=team)
    if clikit.use_json(ctx, as_json):
        clikit.emit_json(saved)
    else:
        clikit.out().print(f"secret {saved['name']} of team {saved['team']} set")


@secret.command("list")
@_TEAM
@clikit.json_flag
@click.pass_context
def list_secrets(ctx: click.Context, team: str | None, as_json: bool) -> None:
    """The team's secrets: names and when they were set, never the values."""
    found = clikit.client(ctx, admin=bool(team)).secrets.list(team=team)
    if clikit.use_json(ctx, as_json):
        clikit.emit_json({"secrets": found})
        return
    table = Table("NAME", "UPDATED", "BY", box=None)
    for s in found:
        table.add_row(s["name"], clikit.when(s.get("updated_at")), s.get("updated_by") or "")
    clikit.out().print(table)


@secret.command("delete")
@click.argument("name")
@_TEAM
@clikit.json_flag
@click.pass_context
def delete_secret(ctx: click.Context, name: str, team: str | None, as_json: bool) -> None:
    """Delete secret NAME; jobs that name it fail to deploy from now on."""
    gone = clikit.client(ctx, admin=bool(team)).secrets.delete(name, team=team)
    if clikit.use_json(ctx, as_json):
        clikit.emit_json(gone)
    else:
        clikit.out().print(f"secret {gone['name']} of team {gone['team']} deleted")

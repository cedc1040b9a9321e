"""`trainforge admin published`: object-store prefixes a platform admin lets teams' jobs read.

A job reads its own team's objects and what is published to its team or to
every team; anything else it names (in `data:`, say) is refused at submit.
"""

from __future__ import annotations

import click

from trainforge import clikit
from trainforge.clikit import emit_json, json_flag, out, use_json


def _print(publications: list[dict]) -> None:
    console = out()
    for p in publications:
        teams = "every team" if "*" in p["teams"] else ", ".join(p["teams"])
        console.print(f"{p['prefix']}  {teams}", markup=False, highlight=False)
    if not publications:
        console.print("nothing is published: jobs read only their own team's objects")


@click.group(cls=clikit.Group, invoke_without_command=True)
@json_flag
@click.pass_context
def published(ctx: click.Context, as_json: bool) -> None:
    """Prefixes published to teams (platform admins); without a subcommand, list them."""
    if ctx.invoked_subcommand is None:
        found = clikit.client(ctx, admin=True).admin.published()
        if use_json(ctx, as_json):
            emit_json(found)
        else:
            _print(found)


@published.command("add")
@click.argument("prefix")
@click.option("--team", "teams", multiple=True, help="a team whose jobs may read it (repeatable)")
@click.option("--everyone", is_flag=True, help="every team's jobs may read it")
@json_flag
@click.pass_context
def add(ctx: click.Context, prefix: str, teams: tuple[str, ...], everyone: bool, as_json: bool) -> None:
    """Publish PREFIX (e.g. store://datasets/mnist/) to --team or --everyone, replacing whom it was published
    to. Never under store://jobs/ or store://experiments/, which hold each team's own objects."""
    if everyone == bool(teams):
        raise click.UsageError("give --everyone or at least one --team")
    result = clikit.client(ctx, admin=True).admin.publish(prefix, ["*"] if everyone else list(teams))
    if use_json(ctx, as_json):
        emit_json(result)
    else:
        _print([result])


@published.command("remove")
@click.argument("prefix")
@json_flag
@click.pass_context
def remove(ctx: click.Context, prefix: str, as_json: bool) -> None:
    """Withdraw PREFIX: jobs submitted or deployed from now on may no longer read it."""
    result = clikit.client(ctx, admin=True).admin.withdraw(prefix)
    if use_json(ctx, as_json):
        emit_json(result)
    else:
        out().print(f"withdrawn: {result['prefix']}", markup=False, highlight=False)

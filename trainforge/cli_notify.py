"""`trainforge notifications JOB` and `trainforge webhook`: a job's webhook deliveries, the team's default webhook.

A job announces its terminal and halted states to its manifest's
`notify: {webhook: URL}` and to the team's default webhook, signed with the
team's signing secret (`trainforge webhook show` prints it for a team admin).
"""

from __future__ import annotations

import click
from rich.table import Table

from trainforge import clikit


@click.command()
@click.argument("job_id")
@clikit.json_flag
@click.pass_context
def notifications(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """A job's webhook deliveries and every attempt of each."""
    found = clikit.client(ctx)._request("GET", f"/v1/jobs/{job_id}/notifications")["deliveries"]
    if clikit.use_json(ctx, as_json):
        clikit.emit_json({"deliveries": found})
        return
    table = Table("EVENT", "URL", "STATUS", "TRIES", "LAST", box=None)
    for d in found:
        last = d["attempts"][-1] if d["attempts"] else {}
        table.add_row(d["event"].get("type", ""), d["url"], d["status"], str(d["tries"]),
                      str(last.get("status_code") or last.get("error") or "-"))
    clikit.out().print(table)


@click.group()
def webhook() -> None:
    """The team's default webhook (team admins)."""


def _print(ctx: click.Context, as_json: bool, hook: dict) -> None:
    if clikit.use_json(ctx, as_json):
        clikit.emit_json(hook)
    else:
        clikit.out().print(f"team {hook['team']}: webhook {hook['webhook'] or '(none)'}\n"
                           f"signing secret {hook['signing_secret']}")


@webhook.command("show")
@clikit.json_flag
@click.pass_context
def show(ctx: click.Context, as_json: bool) -> None:
    """The team's default webhook and the secret its receiver verifies X-Trainforge-Signature with."""
    _print(ctx, as_json, clikit.client(ctx)._request("GET", "/v1/team/notifications"))


@webhook.command("set")
@click.argument("url", required=False)
@click.option("--none", "remove", is_flag=True, help="remove the team's default webhook")
@clikit.json_flag
@click.pass_context
def set_hook(ctx: click.Context, url: str | None, remove: bool, as_json: bool) -> None:
    """Announce every job's terminal and halted states to URL."""
    if not url and not remove:
        raise click.UsageError("give a URL, or --none to remove the default webhook")
    body = {"webhook": None if remove else url}
    _print(ctx, as_json, clikit.client(ctx)._request("PUT", "/v1/team/notifications", json=body))

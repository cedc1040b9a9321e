"""`trainforge admin retention`: how long a team's logs, metrics and outputs are kept."""

from __future__ import annotations

import click

from trainforge import clikit
from trainforge.clikit import emit_json, json_flag, out, use_json


def _days(text: str | None) -> float | None:
    if text is None or text.lower() in ("", "forever", "none"):
        return None
    try:
        value = float(text.lower().removesuffix("d"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a number of days (e.g. 30 or 30d, or 'forever')") from None
    if value <= 0:
        raise click.BadParameter("days must be positive")
    return value


@click.command()
@click.argument("team", required=False)
@click.option("--logs", "logs_days", help="days a job's logs are kept after it ended ('forever': no limit)")
@click.option("--metrics", "metrics_days", help="days its metrics are kept")
@click.option("--outputs", "outputs_days", help="days its outputs are kept")
@click.option("--sweep", is_flag=True, help="apply every team's retention now and list what was deleted")
@json_flag
@click.pass_context
def retention(ctx: click.Context, team: str | None, logs_days: str | None, metrics_days: str | None,
              outputs_days: str | None, sweep: bool, as_json: bool) -> None:
    """Show or set TEAM's retention; a periodic sweep deletes what is older, with an audit entry each."""
    as_json = use_json(ctx, as_json)
    admin = clikit.client(ctx, admin=True).admin
    console = out()
    if sweep:
        deleted = admin.sweep_retention()
        if as_json:
            emit_json(deleted)
        else:
            for d in deleted:
                console.print(f"{d['team']} {d['job']}: {d['kind']} ({d['removed']} items)")
            if not deleted:
                console.print("nothing to delete")
        return
    if not team:
        raise click.UsageError("name a TEAM (or pass --sweep)")
    if any(v is not None for v in (logs_days, metrics_days, outputs_days)):
        current = admin.retention(team)
        policy = admin.set_retention(
            team, logs_days=_days(logs_days) if logs_days is not None else current["logs_days"],
            metrics_days=_days(metrics_days) if metrics_days is not None else current["metrics_days"],
            outputs_days=_days(outputs_days) if outputs_days is not None else current["outputs_days"])
    else:
        policy = admin.retention(team)
    if as_json:
        emit_json(policy)
        return
    for kind in ("logs", "metrics", "outputs"):
        days = policy[f"{kind}_days"]
        console.print(f"{kind:<8} {'kept for ever' if days is None else f'{days:g} days after the job ended'}")


@click.command()
@click.argument("jobs", nargs=-1)
@click.option("--all", "all_jobs", is_flag=True, help="every job with a log archive")
@json_flag
@click.pass_context
def reindex(ctx: click.Context, jobs: tuple[str, ...], all_jobs: bool, as_json: bool) -> None:
    """Rebuild the log search index of JOBS (or --all) from their archives, in the background."""
    if not jobs and not all_jobs:
        raise click.UsageError("name JOBS or pass --all")
    as_json = use_json(ctx, as_json)
    started = clikit.client(ctx, admin=True).admin.reindex_logs(list(jobs), all_jobs)
    if as_json:
        emit_json(started)
    else:
        out().print(f"reindexing {len(started['jobs'])} jobs in the background; "
                    "`trainforge logs JOB -q WORD` shows how much the index holds")

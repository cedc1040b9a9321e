"""`trainforge experiments` and `trainforge experiment ID`: sweeps as tables (or `--json`).

The trial table is the API's order (best objective first); the best trial is
highlighted. `trainforge submit` sends experiment recipes here
(`submit_experiment`), recognised by trainforge/sdk_experiments.py
`recipe_kind`.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from trainforge import clikit
from trainforge.sdk import Client, ClientError
from trainforge.sdk_experiments import ENDED

_STYLES = {"running": "cyan", "completed": "green", "failed": "red", "cancelled": "yellow", "halted": "magenta"}


def _state(state: str) -> Text:
    return Text(state, style=_STYLES.get(state, ""))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _params(params: dict) -> str:
    return " ".join(f"{k}={_number(v) if isinstance(v, float) else v}" for k, v in params.items())


def print_experiment(exp: dict) -> None:
    console = clikit.out()
    objective = exp.get("objective") or {}
    console.print(Text.assemble((exp["id"], "bold"), f" ({exp['name']}) ", _state(exp["state"]),
                                f": {exp['reason']}" if exp.get("reason") else ""))
    if objective:
        console.print(f"objective: {objective.get('goal', 'minimize')} {objective.get('metric')}")
    table = Table(box=None, header_style="bold")
    for column in ("", "trial", "job", "state", "objective", "rung", "params"):
        table.add_column(column)
    for t in exp["trials"]:
        rung = "-" if not t["rungs"] else max(int(k) for k in t["rungs"])
        stopped = f" (stopped at {t['stopped_at_rung']})" if t.get("stopped_at_rung") is not None else ""
        style = "bold green" if t["best"] else ""
        table.add_row("*" if t["best"] else "", str(t["index"]), t["job_id"] or "-", t["state"] + stopped,
                      _number(t["objective"]), str(rung), _params(t["params"]), style=style)
    console.print(table)
    best = next((t for t in exp["trials"] if t["best"]), None)
    if best is not None:
        console.print(Text.assemble("best: trial ", (str(best["index"]), "bold green"),
                                    f" ({best['job_id']}) {objective.get('metric')}={_number(best['objective'])} "
                                    f"{_params(best['params'])}"))


def submit_experiment(client: Client, recipe: Path, code_dir: Path | None, follow: bool, as_json: bool,
                      interval: float) -> dict:
    exp = client.experiments.submit(recipe, code_dir=code_dir)
    if not follow:
        if as_json:
            clikit.emit_json(exp)
        else:
            clikit.out().print(Text.assemble("submitted experiment ", (exp["id"], "bold"), f" ({exp['name']}): ",
                                             _state(exp["state"]), f"; {exp['reason']}"))
        return exp
    final = client.experiments.wait(exp["id"], poll_interval=interval)
    if as_json:
        clikit.emit_json(final)
    else:
        print_experiment(final)
    return final


@click.command("experiments")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000), help="most experiments listed")
@clikit.json_flag
@click.pass_context
def experiments(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The team's experiments, newest first."""
    as_json = clikit.use_json(ctx, as_json)
    found = clikit.client(ctx).experiments.list(limit=limit)
    if as_json:
        clikit.emit_json(found)
        return
    table = Table(box=None, header_style="bold")
    for column in ("id", "name", "state", "trials", "best", "created"):
        table.add_column(column)
    for e in found:
        best = "-" if e["best_trial"] is None else str(e["best_trial"])
        table.add_row(e["id"], e["name"], _state(e["state"]), str(e["trial_count"]), best, clikit.when(e["created_at"]))
    clikit.out().print(table)


@click.command("experiment")
@click.argument("experiment_id")
@click.option("--halt", "action", flag_value="halt", help="halt it: running trials checkpoint and stop")
@click.option("--resume", "action", flag_value="resume", help="resume a halted experiment")
@click.option("--cancel", "action", flag_value="cancel", help="cancel it and its trials")
@click.option("--wait", is_flag=True, help="wait until it completes, fails, is cancelled or halted")
@clikit.json_flag
@click.pass_context
def experiment(ctx: click.Context, experiment_id: str, action: str | None, wait: bool, as_json: bool) -> None:
    """One experiment: its trials by objective (best first, highlighted)."""
    as_json = clikit.use_json(ctx, as_json)
    sweeps = clikit.client(ctx).experiments
    if action:
        exp = getattr(sweeps, action)(experiment_id)
    exp = sweeps.wait(experiment_id) if wait else sweeps.get(experiment_id)
    if as_json:
        click.echo(json.dumps(exp, indent=2, default=str))
    else:
        print_experiment(exp)
    if wait and exp["state"] in ENDED and exp["state"] != "completed":
        raise ClientError(f"experiment {experiment_id} {exp['state']}: {exp['reason']}")

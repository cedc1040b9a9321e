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
from rich.tree import Tree

from trainforge import clikit
from trainforge.sdk import Client, ClientError
from trainforge.sdk_experiments import ENDED, recipe_kind

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


def kind_of(path: Path) -> str:
    """job, experiment or workflow; an unreadable file is a job (the job path reports it)."""
    try:
        return recipe_kind(path.read_text())
    except OSError:
        return "job"


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


def workflow_tree(wf: dict) -> Tree:
    """The DAG as a tree: each node under every node it depends on (repeated there, marked), roots at the top."""
    tree = Tree(Text.assemble((wf["id"], "bold"), f" ({wf['name']}) ", _state(wf["state"]),
                              f": {wf['reason']}" if wf.get("reason") else ""))
    by_name = {n["name"]: n for n in wf["nodes"]}
    children: dict[str, list[str]] = {n["name"]: [] for n in wf["nodes"]}
    for n in wf["nodes"]:
        for parent in n["depends_on"]:
            children[parent].append(n["name"])

    def label(n: dict, seen_before: bool) -> Text:
        best = f", best trial {n['best_trial']}" if n.get("best_trial") is not None else ""
        text = Text.assemble((n["name"], "bold"), " ", _state(n["state"]),
                             f" {n['experiment_id']}" if n.get("experiment_id") else "", best,
                             f" (take {n['take']})" if n["depends_on"] else "")
        if seen_before:
            text.append(" (shown above)", style="dim")
        elif n.get("reason") and n["state"] in ("waiting", "skipped", "failed"):
            text.append(f" - {n['reason']}", style="dim")
        return text

    shown: set[str] = set()

    def add(branch: Tree, name: str) -> None:
        node = by_name[name]
        sub = branch.add(label(node, name in shown))
        if name in shown:
            return
        shown.add(name)
        for child in children[name]:
            add(sub, child)

    for n in wf["nodes"]:
        if not n["depends_on"]:
            add(tree, n["name"])
    return tree


def submit_workflow(client: Client, recipe: Path, code_dir: Path | None, follow: bool, as_json: bool,
                    interval: float) -> dict:
    wf = client.workflows.submit(recipe, code_dir=code_dir)
    if follow:
        wf = client.workflows.wait(wf["id"], poll_interval=interval)
    if as_json:
        clikit.emit_json(wf)
    else:
        clikit.out().print(workflow_tree(wf))
    return wf


@click.command("workflows")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000), help="most workflows listed")
@clikit.json_flag
@click.pass_context
def workflows(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The team's workflows, newest first."""
    as_json = clikit.use_json(ctx, as_json)
    found = clikit.client(ctx).workflows.list(limit=limit)
    if as_json:
        clikit.emit_json(found)
        return
    table = Table(box=None, header_style="bold")
    for column in ("id", "name", "state", "experiments", "created"):
        table.add_column(column)
    for w in found:
        table.add_row(w["id"], w["name"], _state(w["state"]), str(len(w["nodes"])), clikit.when(w["created_at"]))
    clikit.out().print(table)


@click.command("workflow")
@click.argument("workflow_id")
@click.option("--cancel", is_flag=True, help="cancel it and the experiment it runs")
@click.option("--wait", is_flag=True, help="wait until it completes, fails or is cancelled")
@clikit.json_flag
@click.pass_context
def workflow(ctx: click.Context, workflow_id: str, cancel: bool, wait: bool, as_json: bool) -> None:
    """One workflow as a DAG: each experiment under those it depends on, with its state and best trial."""
    as_json = clikit.use_json(ctx, as_json)
    flows = clikit.client(ctx).workflows
    if cancel:
        flows.cancel(workflow_id)
    wf = flows.wait(workflow_id) if wait else flows.get(workflow_id)
    if as_json:
        click.echo(json.dumps(wf, indent=2, default=str))
    else:
        clikit.out().print(workflow_tree(wf))

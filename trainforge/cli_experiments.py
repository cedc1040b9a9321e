"""`trainforge experiments`, `experiment ID`, `workflows` and `workflow ID`: sweeps as tables, DAGs as trees.

Experiments and workflows are both runs of many jobs, listed, shown,
followed and submitted alike (`run_list`, `show_run`, `submit_run`); each
renders its own way. The trial table is the API's order (best objective
first); the best trial is highlighted. `trainforge submit` sends experiment
and workflow recipes here (`submit_experiment`, `submit_workflow`),
recognised by trainforge/sdk_experiments.py `recipe_kind`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from trainforge import clikit
from trainforge.sdk import Client, ClientError
from trainforge.sdk_experiments import ENDED, Runs, recipe_kind

_STYLES = {"running": "cyan", "completed": "green", "failed": "red", "cancelled": "yellow", "halted": "magenta"}


def _state(state: str) -> Text:
    return Text(state, style=_STYLES.get(state, ""))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _params(params: dict) -> str:
    return " ".join(f"{k}={_number(v) if isinstance(v, float) else v}" for k, v in params.items())


def run_list(plural: str, columns: tuple[str, ...], row: Callable[[dict], tuple]) -> click.Command:
    """`trainforge <plural>`: the team's runs as a table with `columns`, one `row(run)` each (or `--json`)."""

    @click.command(plural, help=f"The team's {plural}, newest first.")
    @click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000), help=f"most {plural} listed")
    @clikit.json_flag
    @click.pass_context
    def listing(ctx: click.Context, limit: int, as_json: bool) -> None:
        as_json = clikit.use_json(ctx, as_json)
        found = getattr(clikit.client(ctx), plural).list(limit=limit)
        if as_json:
            clikit.emit_json(found)
            return
        table = Table(box=None, header_style="bold")
        for column in columns:
            table.add_column(column)
        for run in found:
            table.add_row(*row(run))
        clikit.out().print(table)

    return listing


def show_run(ctx: click.Context, plural: str, run_id: str, action: str | None, wait: bool, as_json: bool,
             render: Callable[[dict], None]) -> dict:
    """Act on the run (if asked), then show it: as it is, or once it ended with `wait`."""
    as_json = clikit.use_json(ctx, as_json)  # first: a refusal from here on is printed as JSON too
    runs: Runs = getattr(clikit.client(ctx), plural)
    if action:
        getattr(runs, action)(run_id)
    run = runs.wait(run_id) if wait else runs.get(run_id)
    if as_json:
        click.echo(json.dumps(run, indent=2, default=str))
    else:
        render(run)
    return run


def submit_run(runs: Runs, recipe: Path, code_dir: Path | None, follow: bool, as_json: bool, interval: float,
               submitted: Callable[[dict], None], final: Callable[[dict], None]) -> dict:
    """Submit, follow it to its end if asked, and show it (`submitted` as submitted, `final` once followed)."""
    run = runs.submit(recipe, code_dir=code_dir)
    if follow:
        run = runs.wait(run["id"], poll_interval=interval)
    if as_json:
        clikit.emit_json(run)
    else:
        (final if follow else submitted)(run)
    return run


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
    def submitted(exp: dict) -> None:
        clikit.out().print(Text.assemble("submitted experiment ", (exp["id"], "bold"), f" ({exp['name']}): ",
                                         _state(exp["state"]), f"; {exp['reason']}"))

    return submit_run(client.experiments, recipe, code_dir, follow, as_json, interval, submitted, print_experiment)


experiments = run_list("experiments", ("id", "name", "state", "trials", "best", "created"),
                       lambda e: (e["id"], e["name"], _state(e["state"]), str(e["trial_count"]),
                                  "-" if e["best_trial"] is None else str(e["best_trial"]), clikit.when(e["created_at"])))


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
    exp = show_run(ctx, "experiments", experiment_id, action, wait, as_json, print_experiment)
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


def print_workflow(wf: dict) -> None:
    clikit.out().print(workflow_tree(wf))


def submit_workflow(client: Client, recipe: Path, code_dir: Path | None, follow: bool, as_json: bool,
                    interval: float) -> dict:
    return submit_run(client.workflows, recipe, code_dir, follow, as_json, interval, print_workflow, print_workflow)


workflows = run_list("workflows", ("id", "name", "state", "experiments", "created"),
                     lambda w: (w["id"], w["name"], _state(w["state"]), str(len(w["nodes"])), clikit.when(w["created_at"])))


@click.command("workflow")
@click.argument("workflow_id")
@click.option("--cancel", is_flag=True, help="cancel it and the experiment it runs")
@click.option("--wait", is_flag=True, help="wait until it completes, fails or is cancelled")
@clikit.json_flag
@click.pass_context
def workflow(ctx: click.Context, workflow_id: str, cancel: bool, wait: bool, as_json: bool) -> None:
    """One workflow as a DAG: each experiment under those it depends on, with its state and best trial."""
    show_run(ctx, "workflows", workflow_id, "cancel" if cancel else None, wait, as_json,
             print_workflow)

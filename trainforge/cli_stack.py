"""`trainforge up` and `trainforge down`: the embedded stack, through the launcher process (trainforge/stack.py)."""

from __future__ import annotations

import click
from rich.text import Text

from trainforge import config, stack
from trainforge.clikit import emit_json, json_flag, out, use_json


def _component_row(s: dict) -> Text:
    """One component as the launcher reported it: {name, pid, address, status, detail}."""
    mark = Text("✓ ", style="green") if s.get("status") in stack.OK_STATUSES else Text("✗ ", style="red")
    pid = f"pid {s['pid']}" if s.get("pid") else ""
    detail = s.get("detail") or ""
    return Text.assemble(mark, (f"{s.get('name', ''):<10}", "bold"), f" {pid:<11} {s.get('address') or '':<28} ",
                         str(s.get("status", "")), (f"  {detail}" if detail else "", "dim"))


@click.command()
@json_flag
@click.option("--timeout", default=150.0, show_default=True, help="seconds to wait for the stack to be healthy")
@click.option("--replicas", type=click.IntRange(1, 5), default=None,
              help="API, Trainer and LCM processes each; one elected Trainer dispatches, one LCM deploys "
                   "(default: as running, else 1)")
@click.pass_context
def up(ctx: click.Context, as_json: bool, timeout: float, replicas: int | None) -> None:
    """Start the embedded stack (idempotent) and create team `local` with an API key."""
    as_json = use_json(ctx, as_json)
    state = config.state_dir()
    console = out()
    if as_json:
        emit_json(stack.up(state, timeout=timeout, replicas=replicas))
        return
    with console.status("starting the embedded stack") as spinner:
        def report(s: dict) -> None:
            if s.get("status") == "starting":
                spinner.update(f"waiting for {s.get('name')} (pid {s.get('pid')}) to be healthy")
            else:
                console.print(_component_row(s))

        info = stack.up(state, on_component=report, timeout=timeout, replicas=replicas)
    console.print(f"API {info['api_url']}  team [bold]{info['team']}[/]  stack {info['stack_id']}")
    console.print(f"dashboard {info['api_url'].rstrip('/')}/ui/ (log in with the API key stored below)")
    key_note = "a new API key was" if info["key_created"] else "the API key is"
    console.print(f"{key_note} stored in {state / config.CONFIG_FILE}; logs in {state / 'logs'}")
    if info.get("isolation"):
        console.print(info["isolation"], markup=False)


@click.command()
@json_flag
@click.option("--grace", default=20.0, show_default=True, help="seconds between SIGTERM and SIGKILL")
@click.pass_context
def down(ctx: click.Context, as_json: bool, grace: float) -> None:
    """Stop everything `trainforge up` started, learners included."""
    as_json = use_json(ctx, as_json)
    state = config.state_dir()
    console = out()
    if as_json:
        emit_json({"state_dir": str(state), "components": stack.down(state, grace=grace)})
        return
    with console.status("stopping the embedded stack"):
        statuses = stack.down(state, on_component=lambda s: console.print(_component_row(s)), grace=grace)
    if not statuses:
        console.print(f"no stack in {state}")

"""What every `trainforge` command shares: output (tables or JSON), errors, and the API client.

People get tables, colours and a spinner (rich); `--json` (before or after
the command) gives one machine-readable document per command instead, with
no markup. A failure is one line on stderr and exit status 1.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from trainforge import config, stack
from trainforge.sdk import ApiError, Client, ClientError


def out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def when(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def table(*columns: str) -> Table:
    """A table for a person, without an outer border, with these columns."""
    shown = Table(show_edge=False)
    for col in columns:
        shown.add_column(col)
    return shown


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def answer(as_json: bool, data: Any, show: Callable[[Console, Any], None]) -> None:
    """A command's result: one JSON document with --json, else `show(console, data)` for a person."""
    if as_json:
        emit_json(data)
    else:
        show(out(), data)


class Group(click.Group):
    """Turns the SDK's and the stack's errors into one line and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ClientError, stack.StackError) as e:
            message = " ".join(str(e).split())
            if (ctx.find_root().obj or {}).get("json"):
                body: dict[str, Any] = {"message": message}
                if isinstance(e, ApiError):
                    body.update(status=e.status, code=e.code, details=e.details)
                click.echo(json.dumps({"error": body}))
            click.echo(f"error: {message}", err=True)
            ctx.exit(1)


def json_flag(f):  # noqa: ANN001, ANN201
    return click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")(f)


def use_json(ctx: click.Context, as_json: bool) -> bool:
    ctx.ensure_object(dict)
    root = ctx.find_root()
    root.ensure_object(dict)
    if as_json:
        root.obj["json"] = True
    return bool(root.obj.get("json"))


def client(ctx: click.Context, *, admin: bool = False) -> Client:
    """A client with the configured key; with admin=True the platform admin key when one is configured."""
    try:
        cfg = config.load(config.state_dir(), profile=(ctx.find_root().obj or {}).get("profile"))
    except config.UnknownProfile as e:
        raise ClientError(str(e)) from None
    key = (cfg.admin_key or cfg.api_key) if admin else cfg.api_key
    if not key:
        hint = "run `trainforge admin bootstrap --save` or set TRAINFORGE_ADMIN_KEY" if admin else \
            "run `trainforge up` or set TRAINFORGE_API_KEY"
        raise ClientError(f"no API key configured; {hint}")
    c = Client(cfg.api_url, key)
    ctx.call_on_close(c.close)
    return c

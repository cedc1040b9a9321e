"""What `trainforge submit` and `status` parse and show: KEY=VALUE options, list filters, the upload's progress.

`--param k=v` values are read as YAML scalars, so `--param lr=0.1` is the
number 0.1 as it would be in the manifest; `--env` and `--label` values stay
text. The progress goes to stderr, so `--json` output stays one document.
"""

from __future__ import annotations

import click
import yaml
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from trainforge.packing import CodeFiles, human

_TIME_HELP = "ISO-8601 time or unix seconds"


def list_filters(command):
    """`status`'s list options beyond --state/--label/--limit: name, creation window and every page."""
    for option in reversed((
            click.option("--name", help="only jobs with this name"),
            click.option("--since", help=f"only jobs created at or after this time ({_TIME_HELP})"),
            click.option("--until", help=f"only jobs created before this time ({_TIME_HELP})"),
            click.option("--all", "every", is_flag=True, help="every matching job, following the pages "
                         "(--limit is the page size)"))):
        command = option(command)
    return command


def list_jobs(client, *, every: bool, limit: int, **filters) -> tuple[list[dict], bool]:
    """The jobs to show and whether more match than were fetched (only without --all)."""
    if every:
        return list(client.iter_jobs(page_size=limit, **filters)), False
    page = client.list_page(limit=limit, **filters)
    return page["jobs"], bool(page["next_cursor"])


def pairs(values: tuple[str, ...], what: str, typed: bool) -> dict:
    """('k=v', ...) -> {k: v}; with typed, v is read as YAML (7 -> 7, 0.1 -> 0.1, true -> True)."""
    out: dict = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=what)
        parsed: object = value
        if typed:
            try:
                parsed = yaml.safe_load(value) if value else ""
            except yaml.YAMLError:
                parsed = value
            if not isinstance(parsed, str | int | float | bool):
                parsed = value
        out[key.strip()] = parsed
    return out


def upload_progress(as_json: bool):  # noqa: ANN202 - (on_code, on_upload, finish)
    """Callbacks that show what is packed and a progress bar for the upload (stderr, nothing with --json)."""
    if as_json:
        return None, None, lambda: None
    err = Console(stderr=True, highlight=False)
    bar = Progress("uploading code", BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err,
                   transient=True)
    task: list = []

    def on_code(code: CodeFiles) -> None:
        skipped = f", {code.ignored} ignored (.gitignore/.trainforgeignore)" if code.ignored else ""
        err.print(f"packing {len(code.files)} files, {human(code.total_bytes)}{skipped}")

    def on_upload(n: int, total: int) -> None:
        if not task:
            bar.start()
            task.append(bar.add_task("upload", total=total))
        bar.advance(task[0], n)

    def finish() -> None:
        if task:  # a bar that never started would still print an empty line
            bar.stop()

    return on_code, on_upload, finish

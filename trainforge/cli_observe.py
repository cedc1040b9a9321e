"""`trainforge metrics` and `trainforge events`, and the progress line of `trainforge status`."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainforge import clikit
from trainforge.clikit import emit_json, json_flag, out, use_json, when
from trainforge.sdk import ApiError, Client

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 40) -> str:
    """A one-line chart of the values (resampled to `width` points)."""
    if not values:
        return ""
    if len(values) > width:
        values = [values[int(i * len(values) / width)] for i in range(width - 1)] + [values[-1]]
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(_BARS[min(len(_BARS) - 1, int((v - lo) / span * (len(_BARS) - 1) + 0.5))] for v in values)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def progress_text(progress: dict) -> str:
    """e.g. "step 1,200 of 5,000 (24%), epoch 2 of 10, 35.1 steps/s, ETA 1m48s"; "" when nothing was reported."""
    if not progress or progress.get("step") is None:
        return ""
    parts = [f"step {progress['step']:,}"]
    total = progress.get("total_steps")
    if total:
        parts[0] += f" of {int(total):,} ({100 * progress['step'] / total:.0f}%)"
    if progress.get("epoch") is not None:
        epoch = f"epoch {progress['epoch']:g}"
        if progress.get("total_epochs"):
            epoch += f" of {progress['total_epochs']:g}"
        parts.append(epoch)
    if progress.get("steps_per_second"):
        parts.append(f"{progress['steps_per_second']:.3g} steps/s")
    if progress.get("eta_seconds") is not None:
        parts.append(f"ETA {_duration(progress['eta_seconds'])}")
    return ", ".join(parts)


def print_progress(console: Console, client: Client, job_id: str) -> None:
    """The progress line of `trainforge status JOB`, when the job reported any; silent when it cannot tell."""
    try:
        text = progress_text(client.metrics(job_id).get("progress") or {})
    except ApiError:
        return
    if text:
        console.print(f"progress: {text}")


@click.command()
@click.argument("job_id")
@click.option("--name", "names", multiple=True, help="only this metric (repeatable)")
@json_flag
@click.pass_context
def metrics(ctx: click.Context, job_id: str, names: tuple[str, ...], as_json: bool) -> None:
    """A job's training metrics: last value and a small chart of each series, and its progress."""
    as_json = use_json(ctx, as_json)
    report = clikit.client(ctx).metrics(job_id, list(names) or None)
    if as_json:
        emit_json(report)
        return
    console = out()
    if not report["series"]:
        console.print(f"no metrics for {job_id} ({report['job_state']}); learners report them with "
                      "report_metrics(step, name=value) or lines in $TF_WORKDIR/.tf-metrics.jsonl")
        return
    table = Table(show_edge=False)
    for col in ("metric", "last", "step", "min", "max", "points", "chart"):
        table.add_column(col, justify="right" if col in ("last", "step", "min", "max", "points") else "left")
    for name, points in sorted(report["series"].items()):
        values = [p["value"] for p in points if p["learner"] == 0] or [p["value"] for p in points]
        last = report["last"][name]
        table.add_row(name, f"{last['value']:.6g}", str(last["step"]), f"{min(values):.4g}", f"{max(values):.4g}",
                      str(len(points)), Text(sparkline(values), style="cyan"))
    console.print(table)
    text = progress_text(report.get("progress") or {})
    if text:
        console.print(f"progress: {text}")


@click.command()
@click.argument("job_id")
@json_flag
@click.pass_context
def events(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """A job's timeline: state changes, queue decisions, deploys, restarts and halts, with reasons and actors."""
    as_json = use_json(ctx, as_json)
    clikit.answer(as_json, clikit.client(ctx).events(job_id), _print_events)


def _print_events(console: Console, timeline: list[dict]) -> None:
    table = clikit.table("time", "event", "state", "reason", "actor")
    for ev in timeline:
        table.add_row(when(ev["time"]) if ev.get("time") else "", ev["kind"], ev["to"], Text(ev.get("reason") or ""),
                      ev.get("actor") or "")
    console.print(table)

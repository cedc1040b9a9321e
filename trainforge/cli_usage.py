"""`trainforge admin usage --since …`: the per-day accounting as a table, JSON or CSV.

The figures are computed by the API (GET /v1/admin/usage?since=…); this only
asks and prints. `--csv` writes the server's CSV unchanged, so what a script
saves is exactly the export the dashboard offers.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
from rich.table import Table

from trainforge.clikit import emit_json, out

if TYPE_CHECKING:
    from trainforge.sdk_admin import Admin


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def accounting(admin: Admin, team: str | None, since: str | None, until: str | None, *, as_csv: bool,
               as_json: bool) -> None:
    if since is None:
        raise click.BadParameter("give --since (e.g. 2026-11-01) for the per-day accounting",
                                 param_hint="--since")
    if as_csv:
        text = admin.usage_csv(since, until)
        if team:
            lines = text.splitlines(keepends=True)
            text = "".join([lines[0], *(ln for ln in lines[1:] if ln.split(",", 2)[1] == team)])
        # bytes, so the CRLF line ends of RFC 4180 reach a file unchanged
        stdout = sys.stdout.buffer
        stdout.write(text.encode())
        stdout.flush()
        return
    report = admin.usage_report(since, until)
    if team:
        report = {**report, "days": [d for d in report["days"] if d["team"] == team]}
    if as_json:
        emit_json(report)
        return
    if not report["days"]:
        out().print("no usage in that window")
        return
    table = Table(show_edge=False)
    # the borrowed columns beside their totals: of those hours, the ones held on quota borrowed in the cohort
    for col in ("day", "team", "gpu hours", "borrowed gpu h", "by gpu type", "cpu hours", "borrowed cpu h",
                "memory GiB·h", "jobs", "submitted"):
        table.add_column(col)
    for d in report["days"]:
        by_type = ", ".join(f"{t}={_hours(s)}" for t, s in d["gpu_seconds_by_type"].items()) or "-"
        table.add_row(d["day"], d["team"], _hours(d["gpu_seconds"]), _hours(d.get("borrowed_gpu_seconds", 0.0)),
                      by_type, _hours(d["cpu_seconds"]), _hours(d.get("borrowed_cpu_seconds", 0.0)),
                      _hours(d["memory_gib_seconds"]), str(d["jobs_active"]), str(d["jobs_submitted"]))
    out().print(table)

"""How the CLI shows jobs: states in colour, one job whole, a table of jobs, a log line."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainforge import config
from trainforge.clikit import when as _when

_STATE_STYLE = {"completed": "green", "failed": "red", "cancelled": "yellow", "running": "cyan",
                "storing": "cyan", "deploying": "blue", "queued": "magenta", "pending": "magenta",
                "halting": "yellow", "halted": "yellow", "restarting": "yellow", "preparing": "blue"}


def state_text(state: str) -> Text:
    return Text(state, style=_STATE_STYLE.get(state, ""))



def outputs_location(job: dict) -> str:
    uri = job.get("outputs_uri") or ""
    if not uri:
        return ""
    local = config.state_dir() / "objects" / uri.removeprefix("store://")
    return f"{uri} ({local})" if local.exists() else uri


def print_job(console: Console, job: dict) -> None:
    console.print(Text.assemble((job["id"], "bold"), f"  {job['name']}  ", state_text(job["state"])))
    if job.get("reason"):
        console.print(Text(f"reason: {job['reason']}"))
    if job.get("queue_position"):
        console.print(f"queue position: {job['queue_position']}")
    console.print(f"attempt: {job['attempt']}  submitted: {_when(job['created_at'])}  "
                  f"updated: {_when(job['updated_at'])}")
    if job.get("restarts"):
        console.print(f"restarts: {job['restarts']} of {job['manifest'].get('restart', {}).get('max_restarts', '?')}")
    if job.get("checkpoint_step") is not None:
        console.print(f"checkpoint: step {job['checkpoint_step']}")
    if b := job.get("borrowed"):
        lent = ", ".join(f"{b[k]:g} {k}" for k in ("gpus", "cpus") if b.get(k))
        console.print(f"borrowed: {lent or 'memory'} from cohort {b['cohort']}")
    if job.get("preempted") or job.get("preemptions"):
        console.print(f"preempted: {job.get('preemptions', 0)} time(s){'; ' + job['preempted'] if job.get('preempted') else ''}")
    if world := job.get("world_size"):
        console.print(f"learners: {world['current']} running, target {world['target']} "
                      f"(elastic, {world['min']} to {world['max']})")
    if job.get("outputs_uri"):
        console.print(Text(f"outputs: {outputs_location(job)}"))
    if job.get("learners"):
        table = Table(title="learners", title_justify="left", show_edge=False)
        for col in ("rank", "state", "exit code", "attempt", "message"):
            table.add_column(col)
        for ln in job["learners"]:
            code = "" if ln.get("exit_code") is None else str(ln["exit_code"])
            table.add_row(str(ln["rank"]), state_text(ln["state"]), code, str(ln["attempt"]),
                          Text(ln.get("message") or ""))
        console.print(table)
        for ln in (ln for ln in job["learners"] if ln.get("warning")):
            console.print(Text(f"learner {ln['rank']}: {ln['warning']} (isolation: none)", style="bold red"))
    if job.get("history"):
        table = Table(title="history", title_justify="left", show_edge=False)
        for col in ("time", "from", "to", "reason", "actor"):
            table.add_column(col)
        for ev in job["history"]:
            table.add_row(_when(ev["timestamp"]), ev["from"], state_text(ev["to"]), Text(ev.get("reason") or ""),
                          ev.get("actor") or "")
        console.print(table)


def print_jobs(console: Console, jobs: list[dict]) -> None:
    if not jobs:
        console.print("no jobs")
        return
    table = Table(show_edge=False)
    for col in ("id", "name", "state", "submitted", "reason"):
        table.add_column(col)
    for job in jobs:
        reason = job.get("reason") or ""
        if job.get("queue_position"):
            reason = f"#{job['queue_position']} in queue: {reason}"
        table.add_row(job["id"], job["name"], state_text(job["state"]), _when(job["created_at"]), Text(reason))
    console.print(table)


def print_line(console: Console, line: dict) -> None:
    tag = f"[{line['learner']}]" if line.get("attempt", 1) <= 1 else f"[{line['learner']}/{line['attempt']}]"
    style = "red" if line.get("stream") == "stderr" else ("dim" if line.get("stream") == "system" else "")
    console.print(Text.assemble((tag, "dim"), " ", (line["line"], style)))

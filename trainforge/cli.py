"""The `trainforge` command: the embedded stack and jobs, for people and for scripts.

People get tables, colours and a spinner (rich); `--json` (before or after
the command) gives one machine-readable document per command instead, with
no markup. A failure is one line on stderr and exit status 1; a followed job
exits 0 only when it completed (trainforge/exitcodes.py has the table), so
`trainforge submit --follow` can gate CI.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.text import Text

from trainforge import (
    cli_account,
    cli_admin,
    cli_experiments,
    cli_logs,
    cli_notify,
    cli_observe,
    cli_outputs,
    cli_published,
    cli_retention,
    cli_secrets,
    cli_stack,
    clikit,
    cliopts,
    exitcodes,
)
from trainforge.cli_show import outputs_location, print_job, print_jobs, print_line, state_text
from trainforge.clikit import emit_json as _emit_json
from trainforge.clikit import json_flag as _json_flag
from trainforge.clikit import out as _out
from trainforge.clikit import use_json as _use_json
from trainforge.sdk import Client


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainforge")
    except PackageNotFoundError:
        return "unknown"


@click.group(cls=clikit.Group, context_settings={"help_option_names": ["-h", "--help"]})
@_json_flag
@click.option("--profile", envvar="TRAINFORGE_PROFILE", help="use this profile of `trainforge login`")
@click.version_option(_version(), "--version", "-V", prog_name="trainforge")
@click.pass_context
def main(ctx: click.Context, as_json: bool, profile: str | None) -> None:
    """Submit and follow training jobs on trainforge.

    State (the embedded stack, the API key) lives in $TF_STATE_DIR or ~/.trainforge;
    `trainforge login` saves another platform's URL and key (--profile NAME for several);
    TRAINFORGE_API_URL and TRAINFORGE_API_KEY override them.
    """
    ctx.ensure_object(dict)
    ctx.obj["json"] = as_json
    ctx.obj["profile"] = profile


# -- jobs ------------------------------------------------------------------------------------


_interval = click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.01, 60),
                         help="seconds between polls while following")


def _follow(client: Client, console: Console, job_id: str, interval: float) -> dict:
    """Stream a job's logs and state changes until it ended; return the final job."""
    with console.status(f"{job_id}: waiting") as spinner:
        def on_state(state: str) -> None:
            job = client.get(job_id, retry_seconds=client.reconnect_seconds)
            note = f" — {job['reason']}" if job.get("reason") else ""
            if job.get("queue_position"):
                note += f" (#{job['queue_position']} in queue)"
            console.print(Text.assemble((f"{job_id} ", "dim"), state_text(job["state"]), note))
            spinner.update(f"{job_id}: {state}")

        for line in client.follow_logs(job_id, on_state=on_state, poll_interval=interval):
            print_line(console, line)
    return client.get(job_id, retry_seconds=client.reconnect_seconds)


@main.command()
@click.argument("manifest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--follow", "-f", is_flag=True, help="stream states and logs until the job ends")
@click.option("--code", "code_dir", type=click.Path(file_okay=False, path_type=Path),
              help="upload this folder instead of the manifest's `code:`")
@click.option("--idempotency-key", help="retrying with the same key does not submit twice")
@click.option("--param", "-p", "params", multiple=True, metavar="K=V", help="set params.K (repeatable)")
@click.option("--env", "-e", "envs", multiple=True, metavar="K=V", help="set env.K for the learners (repeatable)")
@_interval
@_json_flag
@click.pass_context
def submit(ctx: click.Context, manifest: Path, follow: bool, code_dir: Path | None, idempotency_key: str | None,
           params: tuple[str, ...], envs: tuple[str, ...], interval: float, as_json: bool) -> None:
    """Submit the job described by MANIFEST (its `code:` folder is packed and uploaded, leaving out what
    .gitignore and .trainforgeignore list)."""
    as_json = _use_json(ctx, as_json)
    client = clikit.client(ctx)
    console = _out()
    kind = cli_experiments.kind_of(manifest)
    if kind != "job":  # an experiment or workflow recipe (kind:, parameters:, Hyper's experiments:)
        submit_recipe = cli_experiments.submit_workflow if kind == "workflow" else cli_experiments.submit_experiment
        submit_recipe(client, manifest, code_dir, follow, as_json, interval)
        return
    on_code, on_upload, done = cliopts.upload_progress(as_json)
    try:
        job = client.submit(manifest, code_dir=code_dir, idempotency_key=idempotency_key,
                            params=cliopts.pairs(params, "--param", typed=True), env=cliopts.pairs(envs, "--env", typed=False),
                            on_code=on_code, on_upload=on_upload)
    finally:
        done()
    if not follow:
        if as_json:
            _emit_json(job)
        else:
            console.print(Text.assemble("submitted ", (job["id"], "bold"), f" ({job['name']}): ",
                                        state_text(job["state"])))
        return
    if as_json:
        final = client.wait(job["id"], poll_interval=interval)
        _emit_json(final)
    else:
        console.print(Text.assemble("submitted ", (job["id"], "bold"), f" ({job['name']})"))
        final = _follow(client, console, job["id"], interval)
        console.print(Text.assemble((final["id"], "bold"), " ended ", state_text(final["state"]),
                                    f": {final['reason']}" if final.get("reason") else ""))
        if final.get("outputs_uri"):
            console.print(Text(f"outputs: {outputs_location(final)}"))
    ctx.exit(exitcodes.for_state(final["state"]))


@main.command()
@click.argument("job_id", required=False, shell_complete=cli_account.complete_job_id)
@click.option("--state", "states", multiple=True, help="only jobs in this state (repeatable)")
@click.option("--label", "labels", multiple=True, metavar="K=V", help="only jobs with this label (repeatable: all)")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000), help="most jobs listed")
@cliopts.list_filters
@click.option("--changed-since", type=click.FloatRange(min=0), metavar="T",
              help="only jobs changed (submitted, moved to another state) at or after unix time T, every page; "
                   "prints the T to pass next")
@_json_flag
@click.pass_context
def status(ctx: click.Context, job_id: str | None, states: tuple[str, ...], labels: tuple[str, ...], limit: int,
           as_json: bool, changed_since: float | None, **filters) -> None:
    """One job in detail (state, reason, learners, history), or a table of the team's jobs."""
    as_json = _use_json(ctx, as_json)
    client = clikit.client(ctx)
    console = _out()
    if changed_since is not None:
        if job_id or states or labels or any(filters.values()):
            raise click.UsageError("--changed-since lists every job that changed: it takes no JOB_ID, --state, "
                                   "--label, --name, --since, --until or --all")
        jobs, as_of = client.list_changed(changed_since, page_size=limit)
        if as_json:
            _emit_json({"jobs": jobs, "as_of": as_of})
        else:
            print_jobs(console, jobs)
            console.print(Text(f"as of {as_of!r}: --changed-since {as_of!r} lists what changes next", style="dim"))
        return
    if job_id:
        job = client.get(job_id)
        if as_json:
            _emit_json(job)
        else:
            print_job(console, job)
            cli_observe.print_progress(console, client, job_id)
        return
    cliopts.pairs(labels, "--label", typed=False)  # K=V, said before anything is sent
    jobs, more = cliopts.list_jobs(client, state=list(states) or None, label=list(labels) or None, limit=limit,
                                   **filters)
    if as_json:
        _emit_json(jobs)
    else:
        print_jobs(console, jobs)
        if more:
            console.print(Text(f"more jobs match: --all lists every one, --limit {limit} per page", style="dim"))


@main.command()
@click.argument("job_id", shell_complete=cli_account.complete_job_id)
@click.option("--follow", "-f", is_flag=True, help="keep streaming until the job ends; exits by its outcome")
@click.option("--learner", type=int, help="only this learner's lines")
@click.option("--query", "-q", help="only lines matching this full-text query (says how much the index holds)")
@click.option("--download", "download_dir", type=click.Path(file_okay=False, path_type=Path),
              help="save each learner's raw log archive (JSON lines) in this folder instead of printing")
@_interval
@_json_flag
@click.pass_context
def logs(ctx: click.Context, job_id: str, follow: bool, learner: int | None, query: str | None,
         download_dir: Path | None, interval: float, as_json: bool) -> None:
    """Print every line of a job's log, in order; a finished job's log comes from its archives, complete."""
    as_json = _use_json(ctx, as_json)
    client = clikit.client(ctx)
    console = _out()
    if download_dir is not None:
        cli_logs.download_logs(client, console, job_id, learner, download_dir, as_json)
        return
    if follow:
        states: list[str] = []
        for line in client.follow_logs(job_id, learner=learner, query=query, poll_interval=interval,
                                       on_state=states.append):
            if as_json:
                click.echo(json.dumps(line))
            else:
                print_line(console, line)
        ctx.exit(exitcodes.for_state(states[-1] if states else ""))
    if query:
        cli_logs.search_logs(client, console, job_id, learner, query, as_json, print_line)
        return
    job_state = client.get(job_id)["state"]
    lines: list[dict] = []
    cursor: dict[str, int] = {}
    printer = cli_logs.LinePrinter(console)
    for line in client.stream_logs(job_id, learner=learner):
        cursor[f"{line['learner']}:{line['attempt']}"] = line["seq"]
        if as_json:
            lines.append(line)
        else:
            printer.print(line)
    printer.close()
    if as_json:
        _emit_json({"lines": lines, "next": cli_logs.format_cursor(cursor), "job_state": job_state})
    elif not cursor:
        console.print(f"no log lines for {job_id} ({job_state})")


def _state_line(job: dict, *, reason: bool = True) -> Text:
    """`<id> <state>`, and `: <reason>` when asked for and the job has one."""
    return Text.assemble((job["id"], "bold"), " ", state_text(job["state"]),
                         f": {job['reason']}" if reason and job.get("reason") else "")


@main.command()
@click.argument("job_id", shell_complete=cli_account.complete_job_id)
@_json_flag
@click.pass_context
def cancel(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Cancel a job and stop its learners."""
    as_json = _use_json(ctx, as_json)
    job = clikit.client(ctx).cancel(job_id)
    clikit.answer(as_json, job, lambda console, cancelled: console.print(_state_line(cancelled, reason=False)))


@main.command()
@click.argument("job_id", shell_complete=cli_account.complete_job_id)
@click.option("--wait/--no-wait", default=True, show_default=True, help="wait until every checkpoint is stored")
@click.option("--timeout", type=float, default=600, show_default=True, help="seconds to wait")
@_json_flag
@click.pass_context
def halt(ctx: click.Context, job_id: str, wait: bool, timeout: float, as_json: bool) -> None:
    """Checkpoint a running job and stop it; its quota is freed. `trainforge resume` continues it."""
    as_json = _use_json(ctx, as_json)
    client = clikit.client(ctx)
    job = client.halt(job_id)
    if wait and job["state"] != "halted":
        with _out().status(f"{job_id}: halting (learners are checkpointing)", spinner="dots"):
            job = client.wait(job_id, timeout=timeout, poll_interval=0.5)
    if as_json:
        _emit_json(job)
        return
    _out().print(_state_line(job))
    if job["state"] not in ("halted", "halting"):
        ctx.exit(1)


@main.command()
@click.argument("job_id", shell_complete=cli_account.complete_job_id)
@_json_flag
@click.pass_context
def resume(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Queue a halted job again; it continues from its last checkpoint."""
    as_json = _use_json(ctx, as_json)
    job = clikit.client(ctx).resume(job_id)
    clikit.answer(as_json, job, lambda console, resumed: console.print(_state_line(resumed)))


# -- the caller and the team ---------------------------------------------------------------


@main.command()
@_json_flag
@click.pass_context
def whoami(ctx: click.Context, as_json: bool) -> None:
    """The team, key id and role of the configured key."""
    as_json = _use_json(ctx, as_json)
    me = clikit.client(ctx).whoami()
    if as_json:
        _emit_json(me)
    else:
        _out().print(f"team {me['team']}  key {me['key_id']}  role {me['role']}")


@main.command()
@_json_flag
@click.pass_context
def token(ctx: click.Context, as_json: bool) -> None:
    """Exchange the configured API key for a short-lived token (JWT), e.g. for the dashboard."""
    as_json = _use_json(ctx, as_json)
    issued = clikit.client(ctx).token()
    if as_json:
        _emit_json(issued)
    else:
        click.echo(issued["token"])


@main.command()
@_json_flag
@click.pass_context
def usage(ctx: click.Context, as_json: bool) -> None:
    """The team's quota, what its running jobs hold, and its queue."""
    as_json = _use_json(ctx, as_json)
    report = clikit.client(ctx).usage()
    if as_json:
        _emit_json(report)
    else:
        cli_admin.print_usage(_out(), [report])


main.add_command(cli_admin.admin)
main.add_command(cli_stack.up)
main.add_command(cli_stack.down)
main.add_command(cli_account.login)
main.add_command(cli_account.completion)
main.add_command(cli_outputs.download)
main.add_command(cli_outputs.checkpoints)
main.add_command(cli_secrets.secret)
main.add_command(cli_notify.notifications)
main.add_command(cli_notify.webhook)
cli_admin.admin.add_command(cli_retention.retention)
cli_admin.admin.add_command(cli_retention.reindex)
cli_admin.admin.add_command(cli_published.published)
main.add_command(cli_observe.metrics)
main.add_command(cli_experiments.experiments)
main.add_command(cli_experiments.experiment)
main.add_command(cli_experiments.workflows)
main.add_command(cli_experiments.workflow)
main.add_command(cli_observe.events)


if __name__ == "__main__":
    sys.exit(main())

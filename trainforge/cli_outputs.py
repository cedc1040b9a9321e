"""`trainforge download` and `trainforge checkpoints`: a job's results back to this machine.

Every file is checked against the SHA-256 the platform recorded when it was
stored (trainforge.results); a mismatch is an error and leaves no file
behind. People get a progress bar on stderr; `--json` prints what was
written instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from trainforge import clikit
from trainforge.results import total_bytes
from trainforge.sdk import ClientError


@contextmanager
def _progress(what: str, total: int, quiet: bool) -> Iterator[Callable[[int], None]]:
    if quiet:
        yield lambda _n: None
        return
    bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), console=Console(stderr=True), transient=False)
    with bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)


def _report(ctx: click.Context, as_json: bool, dest: Path, fetched: list) -> None:  # noqa: ANN001
    files = [{"path": str(f.path), "size": f.size, "sha256": f.sha256} for f in fetched]
    if clikit.use_json(ctx, as_json):
        clikit.emit_json({"dest": str(dest), "files": files})
    else:
        clikit.out().print(f"{len(files)} file(s), {sum(f['size'] for f in files)} bytes, checksums verified, "
                           f"in {dest}")


@click.command()
@click.argument("job_id")
@click.option("-o", "--output", "dest", type=click.Path(file_okay=False, path_type=Path),
              help="folder to write into (default ./<job id>); files land in <folder>/<rank>/<path>")
@click.option("--learner", type=click.IntRange(min=0), help="only this learner's outputs")
@clikit.json_flag
@click.pass_context
def download(ctx: click.Context, job_id: str, dest: Path | None, learner: int | None, as_json: bool) -> None:
    """Download a job's outputs, verifying every file's checksum."""
    results = clikit.client(ctx).results
    dest = dest or Path(job_id)
    listing = results.outputs(job_id, learner)
    files = [f for entry in listing for f in entry["files"]]
    if not files:
        raise ClientError(f"job {job_id} has no outputs" + (f" from learner {learner}" if learner is not None else ""))
    with _progress(f"{job_id} outputs", total_bytes(files), clikit.use_json(ctx, as_json)) as advance:
        fetched = results.download_outputs(job_id, dest, learner, on_bytes=advance, listing=listing)
    _report(ctx, as_json, dest, fetched)


@click.group()
def checkpoints() -> None:
    """A job's stored checkpoints: list the steps, download one."""


@checkpoints.command("list")
@click.argument("job_id")
@clikit.json_flag
@click.pass_context
def list_checkpoints(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """The complete checkpoint steps each learner has in the store, oldest first."""
    learners = clikit.client(ctx).results.checkpoints(job_id)
    if clikit.use_json(ctx, as_json):
        clikit.emit_json({"job_id": job_id, "learners": learners})
        return
    if not learners:
        clikit.out().print(f"job {job_id} has no stored checkpoints")
    for entry in learners:
        clikit.out().print(f"learner {entry['rank']}: steps {', '.join(map(str, entry['steps']))}")


@checkpoints.command("download")
@click.argument("job_id")
@click.option("--step", type=click.IntRange(min=0), help="the step (default: the newest stored one)")
@click.option("--learner", type=click.IntRange(min=0), default=0, show_default=True, help="the learner's rank")
@click.option("-o", "--output", "dest", type=click.Path(file_okay=False, path_type=Path),
              help="folder to write into (default ./<job id>-ckpt-<rank>-<step>)")
@clikit.json_flag
@click.pass_context
def download_checkpoint(ctx: click.Context, job_id: str, step: int | None, learner: int, dest: Path | None,
                        as_json: bool) -> None:
    """Download one checkpoint step of one learner, verifying every file's checksum."""
    results = clikit.client(ctx).results
    if step is None:
        steps = next((e["steps"] for e in results.checkpoints(job_id) if e["rank"] == learner), [])
        if not steps:
            raise ClientError(f"learner {learner} of job {job_id} has no stored checkpoint")
        step = steps[-1]
    dest = dest or Path(f"{job_id}-ckpt-{learner}-{step}")
    files = results.checkpoint_files(job_id, learner, step)
    with _progress(f"{job_id} step {step}", total_bytes(files), clikit.use_json(ctx, as_json)) as advance:
        fetched = results.download_checkpoint(job_id, learner, step, dest, on_bytes=advance, files=files)
    _report(ctx, as_json, dest, fetched)

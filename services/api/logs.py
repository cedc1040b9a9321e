"""Reading a job's log lines for its team, with a cursor that survives late lines.

A settled job's log is read from its archives in the object store
(services/api/logarchive.py): complete whatever the index holds. The index
serves running jobs and full-text search; a search says how much of the log
the index holds, so a partial answer never passes for a complete one.

The log store's cursor is the last sequence number seen per (learner,
attempt) stream. At the REST boundary it travels as one compact string,
`<learner>:<attempt>=<seq>` joined by commas (e.g. `0:1=57,1:1=60`), so
clients treat it as opaque and pass it back as `after`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from trainforge_services.api import logarchive
from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.errors import InvalidArgument, NotFound

_ENTRY = re.compile(r"^(\d+):(\d+)=(\d+)$")


def parse_cursor(text: str | None) -> dict[str, int]:
    if not text:
        return {}
    out: dict[str, int] = {}
    for part in text.split(","):
        m = _ENTRY.match(part.strip())
        if not m:
            raise InvalidArgument(
                f"after: {part!r} is not a log cursor",
                details=[{"field": "after", "message": "expected <learner>:<attempt>=<seq>[,...] as returned in next"}])
        out[f"{int(m.group(1))}:{int(m.group(2))}"] = int(m.group(3))
    return out


def format_cursor(cursor: dict[str, int]) -> str:
    def order(item: tuple[str, int]) -> tuple[int, int]:
        learner, _, attempt = item[0].partition(":")
        return int(learner), int(attempt)

    return ",".join(f"{k}={v}" for k, v in sorted(cursor.items(), key=order))


def read_job_logs(trainer: TrainerApi, logs: LogStore, *, team: str, job_id: str, learner: int | None,
                  after: str | None, limit: int, query: str | None, objects: ObjectStore | None = None) -> dict:
    """A page of a job's lines; NotFound (from the Trainer) for a job the team cannot see."""
    cursor = parse_cursor(after)
    job = trainer.get_job(team, job_id)
    settled = job["state"] in logarchive.SETTLED and objects is not None
    if settled and not query and logarchive.archives(objects, job_id, learner):
        lines, cursor = logarchive.page(objects, job_id, learner=learner, after=cursor, limit=limit)
        return {"lines": lines, "next": format_cursor(cursor), "job_state": job["state"], "source": "archive"}
    page = logs.read(job_id, team=team, learner=learner, after=cursor, limit=limit, query=query or None)
    out = {"lines": page.lines, "next": format_cursor(page.cursor), "job_state": job["state"], "source": "index"}
    if query and not after:
        out.update(search_coverage(logs, objects if settled else None, team=team, job_id=job_id, learner=learner))
    return out


def search_coverage(logs: LogStore, objects: ObjectStore | None, *, team: str, job_id: str,
                    learner: int | None) -> dict:
    """How many of the job's lines the index holds, against the archives' count once the job settled."""
    indexed = logs.count(job_id, team=team, learner=learner)
    total = logarchive.count_lines(objects, job_id, learner) if objects is not None else None
    if total is None:
        note = f"index holds {indexed:,} lines (the job is still running)"
    elif indexed >= total:
        note = f"index holds all {total:,} lines"
    else:
        note = f"index holds {indexed:,} of {total:,} lines; search misses the rest until it is rebuilt"
    return {"indexed": indexed, "total": total, "coverage": note}


def stream_job_logs(trainer: TrainerApi, logs: LogStore, objects: ObjectStore, *, team: str, job_id: str,
                    learner: int | None, page_size: int) -> tuple[str, Iterator[bytes]]:
    """(job state, every line as JSON lines): the archives of a settled job, else the index page by page."""
    job = trainer.get_job(team, job_id)
    if job["state"] in logarchive.SETTLED and logarchive.archives(objects, job_id, learner):
        return job["state"], _batched(logarchive.merged_raw(objects, job_id, learner))

    def from_index() -> Iterator[bytes]:
        cursor: dict[str, int] = {}
        while True:
            page = logs.read(job_id, team=team, learner=learner, after=cursor, limit=page_size)
            if not page.lines:
                return
            cursor = page.cursor
            yield b"".join(json.dumps(ln, ensure_ascii=False).encode() + b"\n" for ln in page.lines)

    return job["state"], from_index()


def _batched(lines: Iterator[bytes], size: int = 1 << 16) -> Iterator[bytes]:
    """Lines joined into chunks of about `size` bytes: one write per chunk, not per line."""
    buf: list[bytes] = []
    n = 0
    for raw in lines:
        buf.append(raw)
        n += len(raw)
        if n >= size:
            yield b"".join(buf)
            buf, n = [], 0
    if buf:
        yield b"".join(buf)


def raw_archive(trainer: TrainerApi, objects: ObjectStore, *, team: str, job_id: str, learner: int,
                attempt: int | None) -> tuple[str, Iterator[bytes]]:
    """(file name, bytes) of one learner's archive: the given attempt, or its latest."""
    trainer.get_job(team, job_id)
    found = [a for a in logarchive.archives(objects, job_id, learner) if attempt is None or a.attempt == attempt]
    if not found:
        what = f"learner {learner}" + (f" attempt {attempt}" if attempt is not None else "")
        raise NotFound(f"no log archive for {what} of job {job_id} (it is uploaded when the learner ends)")
    chosen = found[-1]
    return f"{job_id}-{chosen.learner}-{chosen.attempt}.jsonl", _batched(logarchive.raw_lines(objects, chosen))


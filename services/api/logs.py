"""Reading a job's log lines for its team, with a cursor that survives late lines.

The log store's cursor is the last sequence number seen per (learner,
attempt) stream. At the REST boundary it travels as one compact string,
`<learner>:<attempt>=<seq>` joined by commas (e.g. `0:1=57,1:1=60`), so
clients treat it as opaque and pass it back as `after`.
"""

from __future__ import annotations

import re

from services.api.trainer_client import TrainerApi
from services.common.adapters.logstore import LogStore
from services.common.errors import InvalidArgument

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
                  after: str | None, limit: int, query: str | None) -> dict:
    """A page of a job's lines; NotFound (from the Trainer) for a job the team cannot see."""
    cursor = parse_cursor(after)
    job = trainer.get_job(team, job_id)
    page = logs.read(job_id, team=team, learner=learner, after=cursor, limit=limit, query=query or None)
    return {"lines": page.lines, "next": format_cursor(page.cursor), "job_state": job["state"]}

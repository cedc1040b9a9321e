"""A job's complete log, read from the learners' archives in the object store.

Each learner attempt leaves `store://jobs/<job>/logs/<rank>-<attempt>.jsonl`
(services/common/contracts/storekeys.py), one index document per line, every
line it printed. The search index may lag behind it (a flood faster than the
log store ingests, a log-store outage, a log store restarted empty), so the
archive, not the index, is what a settled job's log is read from. Lines come
back in the index's order - time, learner, attempt, seq - by merging the
archives; a single archive is passed through as it is, without decoding.
Archives are copied to a temporary file one at a time, so memory stays at a
few lines per archive whatever the log's size.
"""

from __future__ import annotations

import json

from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.archives import Archive, archives, merged_raw, raw_lines

__all__ = ["SETTLED", "Archive", "archives", "count_lines", "merged_raw", "page", "raw_lines"]

# Job states in which every learner has ended and uploaded its archive.
SETTLED = frozenset({"completed", "failed", "cancelled", "halted"})


def count_lines(objects: ObjectStore, job_id: str, learner: int | None = None) -> int:
    return sum(1 for a in archives(objects, job_id, learner) for _ in raw_lines(objects, a))


def page(objects: ObjectStore, job_id: str, *, learner: int | None, after: dict[str, int],
         limit: int) -> tuple[list[dict], dict[str, int]]:
    """A page after a cursor, the same shape the index gives (lines, per-stream cursor)."""
    cursor = dict(after)
    lines: list[dict] = []
    for raw in merged_raw(objects, job_id, learner):
        doc = json.loads(raw)
        stream = f"{doc['learner']}:{doc['attempt']}"
        if doc["seq"] <= cursor.get(stream, 0):
            continue
        cursor[stream] = doc["seq"]
        lines.append(doc)
        if len(lines) >= limit:
            break
    return lines, cursor

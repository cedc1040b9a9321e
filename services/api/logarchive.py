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

import heapq
import json
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.contracts import storekeys

log = logging.getLogger(__name__)

# Job states in which every learner has ended and uploaded its archive.
SETTLED = frozenset({"completed", "failed", "cancelled", "halted"})


@dataclass(frozen=True)
class Archive:
    learner: int
    attempt: int
    key: str
    size: int


def archives(objects: ObjectStore, job_id: str, learner: int | None = None, *, kind: str = "logs") -> list[Archive]:
    """The job's log archives (kind "metrics": its metrics archives), by learner then attempt."""
    prefix = storekeys.metrics_prefix(job_id) if kind == "metrics" else storekeys.logs_prefix(job_id)
    found: list[Archive] = []
    for info in objects.list(prefix):
        parsed = storekeys.parse_archive_key(info.key)
        if parsed and parsed.job_id == job_id and (learner is None or parsed.rank == learner):
            found.append(Archive(parsed.rank, parsed.attempt, info.key, info.size))
    return sorted(found, key=lambda a: (a.learner, a.attempt))


def raw_lines(objects: ObjectStore, archive: Archive) -> Iterator[bytes]:
    """One archive's lines as stored (each ending in a newline); a line cut off by a crash is skipped."""
    with tempfile.TemporaryDirectory(prefix="tf-logs-") as tmp:
        path = Path(tmp) / "archive.jsonl"
        objects.get_file(archive.key, path)
        with open(path, "rb") as f:
            for raw in f:
                if raw.endswith(b"\n") and len(raw) > 1:
                    yield raw


def _keyed(objects: ObjectStore, archive: Archive) -> Iterator[tuple[tuple, bytes]]:
    for raw in raw_lines(objects, archive):
        try:
            doc = json.loads(raw)
            yield (doc["ts"], archive.learner, archive.attempt, doc["seq"]), raw
        except (ValueError, KeyError, TypeError):
            log.warning("skipping an unreadable line in %s: %r", archive.key, raw[:200])


def merged_raw(objects: ObjectStore, job_id: str, learner: int | None = None, *,
               kind: str = "logs") -> Iterator[bytes]:
    """Every line of the job, in order, as JSON lines (bytes)."""
    found = archives(objects, job_id, learner, kind=kind)
    if len(found) == 1:
        yield from raw_lines(objects, found[0])
        return
    for _, raw in heapq.merge(*(_keyed(objects, a) for a in found), key=lambda item: item[0]):
        yield raw


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

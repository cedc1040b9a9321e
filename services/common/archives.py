"""Learner archives in the object store: finding a job's log or metrics archives and reading their lines.

Each learner attempt leaves `store://jobs/<job>/logs/<rank>-<attempt>.jsonl`
and `.../metrics/<rank>-<attempt>.jsonl` (services/common/contracts/storekeys.py),
one index document per line, every line it printed or every record it
reported. The search index may lag behind them, so whoever needs all of a
settled job's lines reads them here: the API's log and metrics reads and the
experiment driver's last read of a trial. Archives are copied to a temporary
file one at a time, so memory stays at a few lines per archive whatever the
log's size.
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

"""Rebuild the log search index from the learners' archives in the object store.

    python -m trainforge_services.api.reindex --job j-1a2b3c4d5e6f [--job ...]
    python -m trainforge_services.api.reindex --all

Settings come from the TF_* environment (the API's: log store and object
store). The archive line is the index document and its id is
"<job>.<learner>.<attempt>.<seq>" as the controller ships it, so a reindex
overwrites what the index already holds instead of duplicating it, and can
be run again at any time - after the log store was restarted empty, or to
fill in what a flood left behind.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass

from trainforge_services.api import logarchive
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.objectstore import ObjectStore, store_from_settings
from trainforge_services.common.contracts import storekeys
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.retry import STEADY

log = logging.getLogger(__name__)

BATCH = 2000


@dataclass(frozen=True)
class Reindexed:
    job: str
    lines: int
    archives: int


def jobs_with_archives(objects: ObjectStore) -> list[str]:
    parsed = (storekeys.parse_archive_key(info.key) for info in objects.list("jobs/"))
    return sorted({p.job_id for p in parsed if p and p.kind == "logs"})


def reindex_job(objects: ObjectStore, logs: LogStore, job_id: str, *, batch: int = BATCH,
                deadline: float = 120.0) -> Reindexed:
    """Ship every archived line of the job to the index; a failed batch is retried until `deadline`."""
    found = logarchive.archives(objects, job_id)
    total = 0
    for archive in found:
        pending: list[tuple[str, bytes]] = []
        for raw in logarchive.raw_lines(objects, archive):
            try:
                seq = json.loads(raw)["seq"]
            except (ValueError, KeyError, TypeError):
                continue
            pending.append((f"{job_id}.{archive.learner}.{archive.attempt}.{seq}", raw))
            if len(pending) >= batch:
                _ship(logs, pending, deadline)
                total += len(pending)
                pending = []
        _ship(logs, pending, deadline)
        total += len(pending)
    return Reindexed(job_id, total, len(found))


def _ship(logs: LogStore, docs: list[tuple[str, bytes]], deadline: float) -> None:
    if docs:
        STEADY.within(deadline=deadline).call(lambda: logs.write_raw(docs), retry_on=TrainforgeError)


def main(argv: list[str] | None = None) -> int:
    from trainforge_services.common.settings import ApiSettings

    parser = argparse.ArgumentParser(prog="python -m trainforge_services.api.reindex", description=__doc__.split("\n")[0])
    parser.add_argument("--job", action="append", default=[], help="a job to reindex (repeatable)")
    parser.add_argument("--all", action="store_true", help="every job with a log archive")
    args = parser.parse_args(argv)
    if not args.job and not args.all:
        parser.error("name --job JOB or --all")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ApiSettings()
    objects = store_from_settings(settings)
    logs = LogStore(settings.logstore_url, settings.logstore_index)
    try:
        jobs = jobs_with_archives(objects) if args.all else args.job
        for job in jobs:
            done = reindex_job(objects, logs, job)
            print(json.dumps({"job": done.job, "lines": done.lines, "archives": done.archives}))
        logs.refresh()
    except TrainforgeError as e:
        print(f"reindex failed: {e.message}", file=sys.stderr)
        return 1
    finally:
        logs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

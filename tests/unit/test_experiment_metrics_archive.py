"""The experiment driver's last read of a trial comes from its metrics archives, complete, in attempt order."""

from __future__ import annotations

import json
from pathlib import Path

from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.contracts import storekeys
from trainforge_services.trainer.experiments.metrics import LogStoreMetrics, last_value

JOB = "e-1a2b3c4d5e6f-0"


def archive(store: LocalStore, tmp: Path, rank: int, attempt: int, records: list[dict]) -> None:
    path = tmp / f"{rank}-{attempt}.jsonl"
    lines = [json.dumps({"job_id": JOB, "learner": rank, "attempt": attempt, "seq": seq, "ts": 1000.0 + seq,
                         "stream": "metric", "line": json.dumps(r)}) for seq, r in enumerate(records, 1)]
    path.write_text("\n".join([*lines, '{"cut off by a cra']) + "\n")
    store.put_file(storekeys.metrics_key(JOB, rank, attempt), path)


def test_a_settled_read_takes_every_record_of_rank_0_from_the_archives(tmp_path):
    store = LocalStore(tmp_path / "objects")
    archive(store, tmp_path, 0, 2, [{"step": 3, "loss": 0.3}, {"step": 4, "loss": 0.2}])
    archive(store, tmp_path, 0, 1, [{"step": 1, "loss": 0.9}, {"step": 2, "loss": 0.5}, "not an object"])
    archive(store, tmp_path, 1, 2, [{"step": 4, "loss": 99.0}])  # other ranks do not count
    # no log store listens here: a settled read with archives never needs the index
    reader = LogStoreMetrics("http://127.0.0.1:9", "tf-logs", objects=lambda: store)
    records = reader.records(JOB, "vision", settled=True)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert last_value(records, "loss") == 0.2
    reader.close()

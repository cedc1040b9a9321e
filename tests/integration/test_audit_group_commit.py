"""The audit log's group commit (services/api/audit.py) against the real MongoDB-wire server.

Requests that finish while an audit write is in flight are stored together by the next write, and no
request is answered before the write holding its entry returned.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.integration.test_api_admin import JOB, bearer
from tests.servers import serve_app, wait_for
from trainforge_services.api.app import create_app
from trainforge_services.api.audit import AuditLog
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings

REQUESTS = 8


class CountingAudit(AuditLog):
    """The real audit log, remembering each write's entries; the first write waits for `gate`."""

    def __init__(self, db, gate):  # noqa: ANN001
        super().__init__(db)
        self.batches: list[list[str]] = []
        self._gate = gate
        self._lock = threading.Lock()

    def record_many(self, entries: list[dict]) -> None:
        with self._lock:
            first = not self.batches
            self.batches.append([e["target"] for e in entries])
        if first:
            self._gate()
        super().record_many(entries)


def test_concurrent_requests_share_audit_writes_and_each_answer_follows_its_entry(mongo_db, logstore, tmp_path):
    identity = IdentityStore(mongo_db, touch_interval=0)
    identity.create_team("alpha")
    key = identity.issue_key("alpha", "alice", Role.MEMBER)
    trainer = InMemoryTrainer()
    # the first write is held until every request has reached the Trainer, so the others finish while it is
    # in flight and must wait for a later write
    audit = CountingAudit(mongo_db, lambda: wait_for(lambda: len(trainer.submissions) == REQUESTS, 30,
                                                     "every submit at the Trainer"))
    app = create_app(ApiSettings(dev_mode=True), trainer=trainer, identity=identity, logs=logstore,
                     objects=LocalStore(tmp_path / "objects"), audit=audit)
    stored = mongo_db["audit"]

    with serve_app(app) as url:
        def submit(i: int) -> tuple[str, bool]:
            with httpx.Client(base_url=url, timeout=60) as client:
                resp = client.post("/v1/jobs", data={"manifest": JOB}, headers=bearer(key))
            assert resp.status_code == 201, resp.text
            job_id = resp.json()["id"]
            # answered only after the write holding this request's entry returned
            return job_id, stored.count_documents({"target": job_id, "route": "/v1/jobs", "status": 201}) == 1

        with ThreadPoolExecutor(REQUESTS) as pool:
            answers = list(pool.map(submit, range(REQUESTS)))

    assert all(seen for _, seen in answers), answers
    written = [target for batch in audit.batches for target in batch]
    assert sorted(written) == sorted(job_id for job_id, _ in answers)  # each entry exactly once
    assert len(audit.batches) < REQUESTS, audit.batches  # some write carried several entries

"""Per-team retention: a policy set over the API, a sweep deleting archives, index lines and outputs, audited."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_api_admin import make_platform
from tests.servers import wait_for
from trainforge.sdk import Client
from trainforge_services.common.adapters.logstore import LogLine
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.states import JobState

pytestmark = pytest.mark.integration


def test_a_sweep_applies_each_teams_retention_and_audits_it(mongo_db, logstore, tmp_path):
    with make_platform(mongo_db, logstore, tmp_path) as p:
        objects = LocalStore(tmp_path / "objects")
        jobs = {}
        for team in ("alpha", "beta"):
            job = f"j-{team}0000000"[:14]
            p.trainer.submit_job(team=team, manifest_json=json.dumps({"name": "n"}), code_uri="", submitted_by="t",
                                 job_id=job)
            for state in (JobState.DEPLOYING, JobState.RUNNING, JobState.STORING, JobState.COMPLETED):
                p.trainer.report(job, state, "now")
            objects.put_bytes(f"jobs/{job}/logs/0-1.jsonl", b'{"seq": 1}\n')
            objects.put_bytes(f"jobs/{job}/outputs/0/model.pt", b"weights")
            logstore.write([LogLine(job, team, 0, 1, "stdout", 1, "2030-01-01T00:00:00.000Z", "hi")], refresh=True)
            jobs[team] = job
        client = Client(str(p.client.base_url), p.keys["platform"])
        admin = client.admin
        assert admin.retention("alpha") == {"logs_days": None, "metrics_days": None, "outputs_days": None}
        assert admin.set_retention("alpha", logs_days=1e-5)["logs_days"] == 1e-5  # under a second

        deleted = wait_for(lambda: admin.sweep_retention(), 10, "the alpha job's logs to age out")
        assert deleted == [{"team": "alpha", "job": jobs["alpha"], "kind": "logs", "removed": 2}]
        logstore.refresh()
        assert not objects.exists(f"jobs/{jobs['alpha']}/logs/0-1.jsonl") and logstore.count(jobs["alpha"]) == 0
        assert objects.exists(f"jobs/{jobs['alpha']}/outputs/0/model.pt")  # outputs: kept for ever
        assert objects.exists(f"jobs/{jobs['beta']}/logs/0-1.jsonl") and logstore.count(jobs["beta"]) == 1
        assert admin.sweep_retention() == []  # nothing left to delete, nothing audited twice
        entries = [e for e in admin.audit(team="alpha") if e["method"] == "RETENTION"]
        assert len(entries) == 1 and entries[0]["target"] == jobs["alpha"] and entries[0]["route"] == "retention/logs"
        client.close()


def test_an_admin_rebuilds_a_jobs_index_from_its_archive(mongo_db, logstore, tmp_path):
    with make_platform(mongo_db, logstore, tmp_path) as p:
        objects = LocalStore(tmp_path / "objects")
        job = "j-0123456789ab"
        lines = [LogLine(job, "alpha", 0, 1, "stdout", s, "2030-01-01T00:00:00.000Z", f"line {s}")
                 for s in range(1, 101)]
        objects.put_bytes(f"jobs/{job}/logs/0-1.jsonl", b"".join(json.dumps(ln.to_doc()).encode() + b"\n"
                                                                 for ln in lines))
        with Client(str(p.client.base_url), p.keys["platform"]) as client:
            assert client.admin.reindex_logs([job]) == {"jobs": [job], "started": True}

            def indexed() -> bool:
                logstore.refresh()
                return logstore.count(job) == 100

            wait_for(indexed, 30, "the reindex")
        assert [ln["line"] for ln in logstore.read(job, limit=200).lines] == [f"line {s}" for s in range(1, 101)]

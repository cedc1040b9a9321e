"""The embedded stack on an S3 store (SeaweedFS): a job's controllers work with their job's token only.

`trainforge up` with TF_OBJECTSTORE_URL=s3://... runs the example DDP job.
Its controllers hold no object-store key and no log-store address (read from
their /proc/<pid>/environ while they run); everything reaches the stores through
the API's job gateway: the code comes down, checkpoints and outputs land in
the bucket, the log is searchable afterwards, and the job's token is refused
once it has completed.
"""

from __future__ import annotations

import json
import os

import httpx
import psutil
import pytest

from tests.e2e.test_embedded_stack import cli_json, run_cli, wait_terminal
from tests.integration.test_objectstore_s3 import BUCKET, s3_store
from tests.servers import wait_for
from trainforge_services.common import jobcreds, jobgateway


@pytest.fixture(scope="module")
def s3_stack(tmp_path_factory, s3_server):
    s3_store(s3_server, "", create_bucket=True).close()
    prefix = f"gw-{os.getpid()}"
    state = tmp_path_factory.mktemp("tf-state")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_"))}
    env.update({"TF_STATE_DIR": str(state), "PYTHONUNBUFFERED": "1", "TF_OBJECTSTORE_URL": f"s3://{BUCKET}/{prefix}",
                "TF_S3_ENDPOINT": s3_server.extra["endpoint"], "TF_S3_ACCESS_KEY": s3_server.extra["access_key"],
                "TF_S3_SECRET_KEY": s3_server.extra["secret_key"], "TF_S3_REGION": s3_server.extra["region"],
                # spawned, not forked: a fresh interpreter's /proc/<pid>/environ is exactly what it was given
                "TF_FORK_SERVER": "false"})
    run_cli(env, "up", timeout=180)
    store = s3_store(s3_server, prefix)
    yield env, state, store
    store.close()
    run_cli(env, "down", timeout=120, check=False)


def controllers_of(job_id: str) -> list[dict]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            cmdline = " ".join(p.cmdline())
            if job_id in cmdline and "trainforge_services.controller" in cmdline:
                found.append(p.environ())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def test_the_example_job_runs_with_only_its_token_and_the_token_dies_with_it(s3_stack):
    env, state, store = s3_stack
    job_id = cli_json(env, "submit", "examples/mnist/manifest.yaml", "-p", "epochs=1")["id"]
    seen = wait_for(lambda: controllers_of(job_id) if len(controllers_of(job_id)) == 2 else None, 180,
                    "the job's two controllers")
    for environ in seen:
        assert environ.get(jobgateway.TOKEN_ENV) and environ.get(jobgateway.TICKET_ENV), sorted(environ)
        assert environ.get(jobgateway.URL_ENV, "").startswith("http://")
        assert not {"TF_S3_ACCESS_KEY", "TF_S3_SECRET_KEY", "TF_LOGSTORE_URL", "TF_CREDENTIALS_KEY"} & set(environ)
    job = wait_terminal(env, job_id, 300)
    assert job["state"] == "completed", job
    assert store.info(f"jobs/{job_id}/outputs/0/model.pt").size > 1000
    assert json.loads(store.get_bytes(f"jobs/{job_id}/outputs/0/metrics.json"))["world_size"] == 2
    assert {o.key.split("/")[3] for o in store.list(f"jobs/{job_id}/checkpoints/")} == {"0", "1"}
    assert store.exists(f"jobs/{job_id}/logs/0-1.jsonl") and store.exists(f"jobs/{job_id}/logs/1-1.jsonl")
    lines = cli_json(env, "logs", job_id)["lines"]
    assert any("test accuracy" in ln["line"] for ln in lines) and {ln["learner"] for ln in lines} == {0, 1}
    # the job is over: its token and ticket no longer open anything
    environ = seen[0]
    resp = httpx.post(f"{environ[jobgateway.URL_ENV]}{jobgateway.PREFIX}/{job_id}/objects/list",
                      json={"prefix": f"jobs/{job_id}/"},
                      headers={"Authorization": f"Bearer {environ[jobgateway.TOKEN_ENV]}",
                               jobgateway.TICKET_HEADER: environ[jobgateway.TICKET_ENV]})
    assert resp.status_code == 403 and "completed" in resp.text, resp.text
    key = jobcreds.load_key("", dev_mode=True, state_dir=state)
    assert environ[jobgateway.TOKEN_ENV] == jobgateway.job_token(key, job_id)

"""The dashboard in a real headless browser: Debian's chromium driven by Playwright for Python.

`make browser` (tools/browser/setup.sh) installs chromium; Playwright is pointed at that executable
(its own browser download cannot work here). Without the browser this tier FAILS, never skips.

The platform under the browser is real where it matters: the API served over HTTP, a real Trainer
(gRPC, its MongoDB-wire job store, its dispatcher), identity and audit in MongoDB, log lines in the
OpenSearch-compatible log store. The LCM is a double that takes deploys and runs nothing; the test
plays the job monitor (ReportJobStatus, as services/jobmonitor does) and the controllers (log lines
written to the log store as logship does), so every state change and line arrives when the test says.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from tests.fakes.lcm import IdleLcm
from tests.servers import serve_app
from trainforge_protos import trainer_pb2, trainer_pb2_grpc
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.api.trainer_client import TrainerClient
from trainforge_services.common import rpc, rpcauth
from trainforge_services.common.adapters.logstore import LogLine
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.contracts import storekeys
from trainforge_services.common.settings import ApiSettings, TrainerSettings
from trainforge_services.common.states import JobState
from trainforge_services.trainer.resources import Usage
from trainforge_services.trainer.wiring import serve

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("TF_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "browser"


def pytest_collection_modifyitems(items):
    for item in items:
        if "/browser/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.slow)


def chromium_path() -> str:
    path = os.environ.get("TF_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Debian's chromium is not installed: run `make browser` (tools/browser/setup.sh)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path(), headless=True,
                               args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def artifacts(request) -> Path:
    d = ARTIFACTS / request.node.name
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextlib.contextmanager
def make_platform(mongo_server, mongo_db, logstore, tmp_path, unique):
    settings = TrainerSettings(state_dir=tmp_path, dev_mode=True, mongo_url=mongo_server.url, mongo_db=mongo_db.name,
                               trainer_address="127.0.0.1:0", dispatch_interval=0.2)
    trainer = serve(settings, lcm=IdleLcm(Usage(8, 64, 256 * 2**30, 32), "NOT enforced"), db=mongo_db, collection=f"jobs_{unique}")
    identity = IdentityStore(mongo_db, touch_interval=0)
    for team in ("alpha", "beta", "ops"):
        identity.create_team(team)
    keys = {"member": identity.issue_key("alpha", "ann", Role.MEMBER),
            "beta": identity.issue_key("beta", "bob", Role.MEMBER),
            "platform": identity.issue_key("ops", "root", Role.PLATFORM_ADMIN)}
    client = TrainerClient(trainer.address, authorization=rpcauth.service_authorization(settings))
    channel = rpc.channel(trainer.address, authorization=rpcauth.service_authorization(settings))
    stub = trainer_pb2_grpc.TrainerStub(channel)
    objects = LocalStore(tmp_path / "objects")
    app = create_app(ApiSettings(dev_mode=True, state_dir=tmp_path), trainer=client, identity=identity,
                     logs=logstore, objects=objects)
    seqs: dict[str, int] = {}

    def report(job_id: str, state: JobState, attempt: int = 1, **extra):
        """What the job monitor would report."""
        return rpc.call(stub.ReportJobStatus, trainer_pb2.ReportJobStatusRequest(
            job_id=job_id, attempt=attempt, state=state, reason=f"monitor: {state.name.lower()}", actor="monitor",
            **extra))

    def log(job_id: str, *lines: str, team: str = "alpha", attempt: int = 1):
        """Lines of learner 0, as its controller's shipper writes them."""
        out = []
        for line in lines:
            seqs[job_id] = seqs.get(job_id, 0) + 1
            ts = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            out.append(LogLine(job=job_id, team=team, learner=0, attempt=attempt, stream="stdout",
                               seq=seqs[job_id], ts=ts, line=line))
        logstore.write(out, refresh=True)

    metrics_store = logstore.metrics_store()
    metric_seqs: dict[str, int] = {}

    def metric(job_id: str, record: dict, team: str = "alpha", attempt: int = 1):
        """One `report_metrics` record of learner 0, as the controller's metrics tail indexes it."""
        metric_seqs[job_id] = metric_seqs.get(job_id, 0) + 1
        ts = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        metrics_store.write([LogLine(job=job_id, team=team, learner=0, attempt=attempt, stream="metrics",
                                     seq=metric_seqs[job_id], ts=ts, line=json.dumps(record))], refresh=True)

    def output(job_id: str, rank: int, path: str, data: bytes):
        """A file of a learner's outputs, as its controller uploads it when the learner completes."""
        local = tmp_path / "upload"
        local.write_bytes(data)
        objects.put_file(storekeys.outputs_prefix(job_id, rank) + path, local)

    try:
        with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as http:
            yield SimpleNamespace(url=url, http=http, keys=keys, report=report, log=log, metric=metric, output=output,
                                  h={k: {"Authorization": f"Bearer {v}"} for k, v in keys.items()})
    finally:
        metrics_store.close()
        channel.close()
        client.close()
        trainer.stop(0)


@pytest.fixture
def platform(mongo_server, mongo_db, logstore, tmp_path, unique):
    with make_platform(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        yield p


@pytest.fixture
def pages(browser, platform):
    """new(who) -> a page in its own browser context, logged in with that key (or not, who=None)."""
    contexts = []

    def new(who: str | None):
        context = browser.new_context(base_url=platform.url, viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.dialogs = []
        page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        if who is not None:
            page.goto("/ui/login")
            page.fill("#api_key", platform.keys[who])
            page.click("button[type=submit]")
            page.wait_for_url("**/ui/jobs")
        return page

    yield new
    for c in contexts:
        c.close()

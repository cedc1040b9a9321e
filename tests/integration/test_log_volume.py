"""Complete logs at any volume: real controllers flood real log stores; the API and CLI read every line.

Each test runs the controller as a process (tests/integration/test_controller_run.py's `launch`),
then reads the job through the real API app (in-memory Trainer) with the CLI and the SDK. The log
store (osmem-server) ingests a few thousand lines a second, far slower than a learner prints, so
the index lags and a settled job's log must come from its archives.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from tests import servers
from tests.fakes.trainer_memory import InMemoryTrainer
from tests.integration.test_controller_run import controller_log, launch, status  # noqa: F401 - the fixture
from tests.servers import serve_app, wait_for
from trainforge import config
from trainforge.cli import main
from trainforge.sdk import Client
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.api.reindex import reindex_job
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.objectstore import store_from_settings
from trainforge_services.common.states import JobState

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

LINES = 200_000
TEAM = "team-a"  # the team `launch` gives its learners
TO_COMPLETED = (JobState.DEPLOYING, JobState.RUNNING, JobState.STORING, JobState.COMPLETED)
_PLAIN = re.compile(r"^\[0(?:/(\d+))?\] (.*)$")


def flood(lines: int = LINES, pause_at: int | None = None, marker: Path | None = None) -> str:
    """A learner printing `lines` lines of ~90 bytes (waiting for `marker` after `pause_at`), then one stderr line."""
    script = textwrap.dedent(f"""
        import os, sys, time
        w = sys.stdout.write
        pad = "x" * 76
        for i in range({lines}):
            if i == {pause_at if pause_at is not None else -1}:
                sys.stdout.flush()
                end = time.monotonic() + 120
                while not os.path.exists({str(marker)!r}) and time.monotonic() < end:
                    time.sleep(0.05)
            w(f"line {{i:07d}} {{pad}}\\n")
        sys.stdout.flush()
        sys.stderr.write("flood done\\n")
    """)
    return f"python -c {shlex.quote(script)}"


def shipping_lag(coordinator, run) -> int:  # noqa: ANN001
    value, _ = coordinator.get(coordinator.keys.logship(run.job, run.rank))
    return value["archived"] - value["shipped"] if value and value["attempt"] == run.attempt else 0


def archived_lines(run) -> int:  # noqa: ANN001
    path = run.spec_path.parent / f"learner-{run.rank}-{run.attempt}.log.jsonl"
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


@pytest.fixture
def reader(mongo_db, store_settings, tmp_path):
    """`read(job)`: the API app over the test's log store and object store, with the CLI and SDK on it."""
    made: list = []

    def start(logstore_url: str | None = None) -> SimpleNamespace:
        identity = IdentityStore(mongo_db)
        identity.create_team(TEAM)
        key = identity.issue_key(TEAM, "cli", Role.MEMBER)
        trainer = InMemoryTrainer()
        logs = LogStore(logstore_url or store_settings.logstore_url, store_settings.logstore_index)
        objects = store_from_settings(store_settings)
        app = create_app(store_settings_api(store_settings), trainer=trainer, identity=identity, logs=logs,
                         objects=objects)
        ctx = serve_app(app)
        url = ctx.__enter__()
        made.append((ctx, logs))
        state = tmp_path / "cli-state"
        config.save(state, config.Config(api_url=url, api_key=key, team=TEAM))
        runner = CliRunner(env={"TF_STATE_DIR": str(state), "TRAINFORGE_API_URL": None, "TRAINFORGE_API_KEY": None})

        def cli(*args: str) -> str:
            result = runner.invoke(main, list(args), catch_exceptions=False)
            assert result.exit_code == 0, (result.stdout, result.stderr)
            return result.stdout

        def settle(job: str) -> None:
            trainer.submit_job(team=TEAM, manifest_json=json.dumps({"name": "flood"}), code_uri="",
                               submitted_by="t", job_id=job)
            for state in TO_COMPLETED:
                trainer.report(job, state, f"now {state.name.lower()}")

        sdk = Client(url, key, timeout=120)
        made.append((None, sdk))
        return SimpleNamespace(cli=cli, sdk=sdk, logs=logs, objects=objects, settle=settle)

    yield start
    for ctx, closable in made:
        if ctx is not None:
            ctx.__exit__(None, None, None)
        closable.close()


def store_settings_api(store_settings):  # noqa: ANN001, ANN201
    from trainforge_services.common.settings import ApiSettings

    return ApiSettings(**store_settings.model_dump())


def plain_lines(out: str) -> list[tuple[int, str]]:
    """(attempt, text) of each line `trainforge logs` printed."""
    parsed = []
    for row in out.splitlines():
        m = _PLAIN.match(row)
        assert m, f"unexpected output line {row!r}"
        parsed.append((int(m.group(1) or 1), m.group(2)))
    return parsed


def expected(lines: int = LINES) -> list[str]:
    """The flood's stdout lines, in order (its one stderr line comes from another pipe, in any place)."""
    pad = "x" * 76
    return [f"line {i:07d} {pad}" for i in range(lines)]


def complete(texts: list[str], lines: int = LINES) -> bool:
    """Exactly the flood's stdout lines in order, plus its stderr line once."""
    assert texts.count("flood done") == 1, "the stderr line is missing or repeated"
    assert [t for t in texts if t != "flood done"] == expected(lines)
    return True


def test_a_200k_line_learner_reads_back_complete_and_in_order(launch, coordinator, reader):  # noqa: F811
    run = launch({"command": flood()}, log_drain_seconds="2")
    assert run.wait(300) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["exit_code"] == 0 and doc["lines_archived"] == LINES + 1, doc
    # Recorded, and never more than archived; how many reached the index within the drain window
    # depends on the machine's load (the shipper runs at low priority), so 0 is a valid record.
    assert isinstance(doc["lines_shipped"], int) and 0 <= doc["lines_shipped"] <= doc["lines_archived"], doc

    api = reader()
    api.settle(run.job)
    started = time.monotonic()
    out = api.cli("logs", run.job)
    elapsed = time.monotonic() - started
    assert complete([text for _, text in plain_lines(out)])
    print(f"read {LINES + 1} lines through API+CLI in {elapsed:.2f}s ({(LINES + 1) / elapsed:,.0f} lines/s)")

    found = json.loads(api.cli("logs", run.job, "-q", "0000042", "--json"))
    assert re.match(r"index holds [\d,]+ (of [\d,]+ lines|all [\d,]+ lines)", found["coverage"]), found


def test_the_log_store_stopped_for_10s_mid_flood_loses_nothing(launch, coordinator, reader, store_settings):  # noqa: F811
    osmem = servers.start_osmem()
    try:
        marker = Path(store_settings.state_dir) / "resume-flood"
        run = launch({"command": flood(pause_at=LINES // 2, marker=marker)}, log_drain_seconds="20",
                     logstore_url=osmem.url)
        probe = LogStore(osmem.url, store_settings.logstore_index)
        wait_for(lambda: archived_lines(run) >= LINES // 2, 240, "the first half of the flood")
        wait_for(lambda: probe.count(run.job) > 0, 60, "the first lines in the index")
        probe.close()
        osmem.stop(signal.SIGKILL)
        stopped = time.monotonic()
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        wait_for(lambda: archived_lines(run) >= LINES + 1, 240, "the rest of the flood, archived")
        # what the LCM's trainforge_log_shipping_lag_lines sums: the controller's report in etcd
        wait_for(lambda: shipping_lag(coordinator, run) > 0, 20, "the controller to report its shipping lag")
        wait_for(lambda: time.monotonic() - stopped >= 10, 15, "10 s of log-store outage", interval=0.2)
        osmem.restart()
        assert run.wait(300) == 0, controller_log(run)
        doc = status(coordinator, run)
        assert doc["lines_archived"] == LINES + 1, doc

        api = reader(osmem.url)
        api.settle(run.job)
        assert complete([text for _, text in plain_lines(api.cli("logs", run.job))])
    finally:
        osmem.cleanup()


def test_a_controller_sigkilled_mid_flood_keeps_each_attempts_lines_apart(launch, coordinator, reader,  # noqa: F811
                                                                         store_settings):
    marker = Path(store_settings.state_dir) / "resume-flood"
    first = launch({"command": flood(pause_at=LINES // 2, marker=marker)}, log_drain_seconds="2")
    wait_for(lambda: archived_lines(first) >= LINES // 2, 240, "the first half of the flood")
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()

    second = launch({"command": flood()}, job=first.job, attempt=2, log_drain_seconds="2")
    assert second.wait(300) == 0, controller_log(second)
    assert status(coordinator, second)["lines_archived"] == LINES + 1

    api = reader()
    api.settle(first.job)
    printed = plain_lines(api.cli("logs", first.job))
    assert complete([text for attempt, text in printed if attempt == 2])
    killed = [text for attempt, text in printed if attempt == 1]
    assert len(killed) >= LINES // 2 and killed == expected()[:len(killed)]
    assert [ln["attempt"] for ln in api.sdk.stream_logs(first.job)][-1] == 2


def test_a_restarted_log_store_still_serves_finished_logs_and_search_returns_after_reindex(
        launch, coordinator, reader, store_settings, tmp_path):  # noqa: F811
    osmem = servers.start_osmem()
    try:
        run = launch({"command": flood(2000)}, logstore_url=osmem.url)
        assert run.wait(120) == 0, controller_log(run)
        assert status(coordinator, run)["lines_shipped"] == 2001, (status(coordinator, run), controller_log(run))
        osmem.restart()  # in-memory: it comes back empty

        api = reader(osmem.url)
        api.settle(run.job)
        assert complete([text for _, text in plain_lines(api.cli("logs", run.job))], 2000)
        before = json.loads(api.cli("logs", run.job, "-q", "0001234", "--json"))
        assert before["lines"] == [] and before["coverage"].startswith("index holds 0 of 2,001 lines")

        assert reindex_job(api.objects, api.logs, run.job).lines == 2001
        api.logs.refresh()
        after = json.loads(api.cli("logs", run.job, "-q", "0001234", "--json"))
        assert [ln["line"] for ln in after["lines"]] == [expected(2000)[1234]]
        assert after["coverage"] == "index holds all 2,001 lines"

        saved = json.loads(api.cli("logs", run.job, "--download", str(tmp_path / "dl"), "--json"))["files"]
        raw = Path(saved[0]["path"]).read_bytes().splitlines()
        assert complete([json.loads(r)["line"] for r in raw], 2000)
    finally:
        osmem.cleanup()

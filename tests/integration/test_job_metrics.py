"""Training metrics round trip: the torch helper in a real learner -> controller -> API -> CLI --json."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

import pytest

from tests.integration.test_controller_run import controller_log, launch, status  # noqa: F401 - the fixture
from tests.integration.test_log_volume import reader  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_metrics_reported_by_the_helper_read_back_through_api_and_cli(launch, coordinator, reader):  # noqa: F811
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from trainforge_frameworks.torch.helper import report_metrics
        for step in range(1, 21):
            report_metrics(step, loss=1.0 / step, accuracy=step / 20, epoch=(step - 1) // 10, total_steps=20,
                           total_epochs=2)
        print("trained")
    """)
    run = launch({"command": f"python -c {shlex.quote(script)}"})
    assert run.wait(60) == 0, controller_log(run)
    assert status(coordinator, run)["exit_code"] == 0

    api = reader()
    api.settle(run.job)
    report = json.loads(api.cli("metrics", run.job, "--json"))
    assert report["source"] == "archive"
    assert [p["step"] for p in report["series"]["loss"]] == list(range(1, 21))
    assert report["series"]["loss"][-1]["value"] == pytest.approx(0.05)
    assert report["last"]["accuracy"]["value"] == 1.0
    assert report["progress"]["step"] == 20 and report["progress"]["total_steps"] == 20
    assert report["progress"]["epoch"] == 1 and report["progress"]["eta_seconds"] in (0.0, None)
    only = json.loads(api.cli("metrics", run.job, "--name", "loss", "--json"))
    assert set(only["series"]) == {"loss"}
    table = api.cli("metrics", run.job)
    assert "loss" in table and "accuracy" in table and "step 20 of 20" in table
    # the metrics stay out of the log
    assert [ln["line"] for ln in api.sdk.stream_logs(run.job)] == ["trained"]
    assert "progress: step 20 of 20" in api.cli("status", run.job)
    timeline = json.loads(api.cli("events", run.job, "--json"))
    assert [ev["kind"] for ev in timeline][:3] == ["submit", "queue", "deploy"]

"""The `trainforge` CLI against the real API app (in-memory Trainer), as people and scripts use it."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.servers import serve_app, wait_for
from trainforge import config
from trainforge.cli import main
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.common.adapters.logstore import LogLine
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings
from trainforge_services.common.states import JobState

TO_COMPLETED = (JobState.DEPLOYING, JobState.RUNNING, JobState.STORING, JobState.COMPLETED)


@pytest.fixture
def cli(mongo_db, logstore, tmp_path):
    identity = IdentityStore(mongo_db)
    identity.create_team("alpha")
    key = identity.issue_key("alpha", "cli", Role.MEMBER)
    trainer = InMemoryTrainer()
    state = tmp_path / "state"
    objects = LocalStore(state / "objects")
    app = create_app(ApiSettings(dev_mode=True), trainer=trainer, identity=identity, logs=logstore, objects=objects)
    with serve_app(app) as url:
        config.save(state, config.Config(api_url=url, api_key=key, team="alpha"))
        runner = CliRunner(env={"TF_STATE_DIR": str(state), "TRAINFORGE_API_URL": None, "TRAINFORGE_API_KEY": None,
                                "COLUMNS": "200"})

        def run(*args, code=0):
            result = runner.invoke(main, list(args), catch_exceptions=False)
            assert result.exit_code == code, (result.stdout, result.stderr)
            return result

        def run_json(*args, code=0):
            return json.loads(run(*args, "--json", code=code).stdout)

        yield SimpleNamespace(run=run, json=run_json, trainer=trainer, logs=logstore, state=state, runner=runner,
                              tmp=tmp_path)


def manifest(tmp_path, text="name: demo\nframework: custom\nlearners: 2\ncommand: python train.py\ncode: src\n"):
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def ship(logs, job_id, learner, seqs, stream="stdout"):
    logs.write([LogLine(job_id, "alpha", learner, 1, stream, s, f"2030-01-01T00:00:{s:02d}.{learner:03d}Z",
                        f"learner {learner} says {s}") for s in seqs], refresh=True)


def complete(trainer, job_id, outputs=True):
    for state in TO_COMPLETED:
        trainer.report(job_id, state, f"now {state.name.lower()}",
                       outputs_uri=f"store://jobs/{job_id}/outputs/" if outputs else "")


def test_submit_status_cancel_as_json(cli):
    job = cli.json("submit", manifest(cli.tmp))
    assert job["state"] == "queued" and job["id"].startswith("j-")
    assert cli.json("status", job["id"])["id"] == job["id"]
    assert [j["id"] for j in cli.json("status")] == [job["id"]]
    assert cli.json("--json", "status", "--state", "queued") == cli.json("status")  # global flag too
    cancelled = cli.json("cancel", job["id"])
    assert cancelled["state"] == "cancelled" and cancelled["history"][-1]["to"] == "cancelled"
    assert cli.json("status", "--state", "running") == []


def test_human_output(cli):
    job_id = cli.json("submit", manifest(cli.tmp))["id"]
    out = cli.run("submit", manifest(cli.tmp)).stdout
    assert "submitted j-" in out and "queued" in out
    cli.trainer.report(job_id, JobState.DEPLOYING, "dispatched", actor="trainer",
                       learners=[{"rank": 0, "state": "preparing", "exit_code": None, "attempt": 1, "message": ""},
                                 {"rank": 1, "state": "preparing", "exit_code": None, "attempt": 1, "message": ""}])
    out = cli.run("status", job_id).stdout
    for text in (job_id, "deploying", "reason: dispatched", "learners", "preparing", "history", "pending", "queued",
                 "trainer"):
        assert text in out
    table = cli.run("status").stdout
    assert job_id in table and "#2 in queue: waiting for capacity" in table


def test_status_says_plainly_that_a_learner_is_not_isolated(cli):
    from trainforge_services.common.isolation import NOT_ISOLATED

    job_id = cli.json("submit", manifest(cli.tmp))["id"]
    cli.trainer.report(job_id, JobState.DEPLOYING, "dispatched", actor="trainer",
                       learners=[{"rank": 0, "state": "running", "exit_code": None, "attempt": 1, "message": "",
                                  "isolation": "none", "warning": NOT_ISOLATED},
                                 {"rank": 1, "state": "running", "exit_code": None, "attempt": 1, "message": "",
                                  "isolation": "sandbox"}])
    out = " ".join(cli.run("status", job_id).stdout.split())
    assert f"learner 0: {NOT_ISOLATED} (isolation: none)" in out
    assert "learner 1:" not in out
    assert cli.json("status", job_id)["learners"][0]["warning"] == NOT_ISOLATED


def test_logs_pages_through_every_line(cli):
    job_id = cli.json("submit", manifest(cli.tmp))["id"]
    ship(cli.logs, job_id, 0, range(1, 30))
    ship(cli.logs, job_id, 1, range(1, 12), stream="stderr")
    logs = cli.json("logs", job_id)
    for learner, count in ((0, 29), (1, 11)):
        assert [ln["seq"] for ln in logs["lines"] if ln["learner"] == learner] == list(range(1, count + 1))
    assert logs["next"] == "0:1=29,1:1=11" and logs["job_state"] == "queued"
    only1 = cli.json("logs", job_id, "--learner", "1")["lines"]
    assert {ln["learner"] for ln in only1} == {1} and len(only1) == 11
    out = cli.run("logs", job_id, "--learner", "0").stdout
    assert "[0] learner 0 says 1\n" in out and "says 29" in out and "[1]" not in out


def test_logs_follow_ends_with_the_job(cli):
    job_id = cli.json("submit", manifest(cli.tmp))["id"]
    ship(cli.logs, job_id, 0, range(1, 4))
    complete(cli.trainer, job_id)
    lines = [json.loads(ln) for ln in cli.run("logs", job_id, "--follow", "--json", "--interval", "0.05").stdout.splitlines()]
    assert [ln["seq"] for ln in lines] == [1, 2, 3]


def test_submit_follow_streams_and_exits_by_outcome(cli):
    path = manifest(cli.tmp)

    def drive(outcome):
        count = len(cli.trainer.submissions)

        def run():
            job_id = wait_for(lambda: len(cli.trainer.submissions) > count and cli.trainer.submissions[-1]["job_id"],
                              10, "the submission")
            ship(cli.logs, job_id, 0, range(1, 3))
            if outcome == "completed":
                complete(cli.trainer, job_id)
            else:
                cli.trainer.report(job_id, JobState.DEPLOYING, "dispatched")
                cli.trainer.report(job_id, JobState.FAILED, "learner 1 exited with code 3")
        t = threading.Thread(target=run)
        t.start()
        return t

    t = drive("completed")
    out = cli.run("submit", path, "--follow", "--interval", "0.05").stdout
    t.join(10)
    assert "[0] learner 0 says 1" in out and "[0] learner 0 says 2" in out
    assert "completed" in out and "outputs: store://jobs/" in out

    t = drive("failed")
    result = cli.run("submit", path, "--follow", "--interval", "0.05", code=3)  # exitcodes.JOB_FAILED
    t.join(10)
    assert "failed" in result.stdout and "code 3" in result.stdout

    t = drive("completed")
    final = cli.json("submit", path, "--follow", "--interval", "0.05")
    t.join(10)
    assert final["state"] == "completed"


def test_errors_are_one_line_without_traceback(cli):
    result = cli.run("status", "j-doesnotexist", code=1)
    assert result.stderr.count("\n") == 1 and "not found" in result.stderr.lower()
    assert "Traceback" not in result.output
    err = json.loads(cli.run("status", "j-doesnotexist", "--json", code=1).stdout)["error"]
    assert err["status"] == 404 and err["code"] == "not_found"

    bad = cli.tmp / "bad.yaml"
    bad.write_text("name: Bad_Name\nlearners: 0\nresources: {memory: lots}\n")
    result = cli.run("submit", str(bad), code=1)
    for field in ("name", "learners", "resources.memory", "command"):
        assert field in result.stderr
    assert result.stderr.count("\n") == 1


def test_without_a_key_the_cli_says_what_to_do(cli, tmp_path):
    result = cli.runner.invoke(main, ["status"], env={"TF_STATE_DIR": str(tmp_path / "empty")})
    assert result.exit_code == 1 and "trainforge up" in result.stderr


def test_environment_overrides_the_config_file(cli, tmp_path):
    cfg = config.load_file(cli.state)
    result = cli.runner.invoke(main, ["status", "--json"], env={
        "TF_STATE_DIR": str(tmp_path / "empty"), "TRAINFORGE_API_URL": cfg.api_url, "TRAINFORGE_API_KEY": cfg.api_key})
    assert result.exit_code == 0 and json.loads(result.stdout) == []

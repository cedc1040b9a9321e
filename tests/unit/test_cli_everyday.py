"""The CLI's everyday pieces: exit codes, --version, login and profiles, completion, labels, --param/--env."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from tests.unit.test_cli_commands import cli, manifest, ship  # noqa: F401 - cli is a fixture
from trainforge import config, exitcodes, stack
from trainforge.cli import main
from trainforge_services.common.states import JobState


def test_logs_follow_exits_by_the_jobs_outcome(cli):  # noqa: F811
    job_id = cli.json("submit", manifest(cli.tmp))["id"]
    ship(cli.logs, job_id, 0, range(1, 3))
    cli.trainer.report(job_id, JobState.DEPLOYING, "dispatched")
    cli.trainer.report(job_id, JobState.FAILED, "learner 0 exited with code 3")
    out = cli.run("logs", job_id, "-f", "--interval", "0.05", code=exitcodes.JOB_FAILED).stdout
    assert "learner 0 says 2" in out
    other = cli.json("submit", manifest(cli.tmp))["id"]
    cli.json("cancel", other)
    cli.run("logs", other, "-f", "--interval", "0.05", code=exitcodes.JOB_CANCELLED)


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("trainforge, version ")


def test_login_saves_profiles_and_profile_picks_one(cli, tmp_path):  # noqa: F811
    cfg = config.load_file(cli.state)
    state = tmp_path / "laptop"
    runner = CliRunner(env={"TF_STATE_DIR": str(state), "TRAINFORGE_API_URL": None, "TRAINFORGE_API_KEY": None,
                            "TRAINFORGE_PROFILE": None})
    bad = runner.invoke(main, ["login", "--url", cfg.api_url, "--key", "tf_00000000_" + "x" * 43])
    assert bad.exit_code == exitcodes.ERROR and not (state / config.CONFIG_FILE).exists()
    ok = runner.invoke(main, ["login", "--url", cfg.api_url, "--profile", "work"], input=cfg.api_key + "\n")
    assert ok.exit_code == 0, ok.output
    assert "as team alpha" in ok.stdout and "profile 'work'" in ok.stdout and cfg.api_key not in ok.stdout
    saved = json.loads((state / config.CONFIG_FILE).read_text())
    assert saved["profiles"]["work"]["team"] == "alpha" and saved["api_key"] == ""
    assert oct((state / config.CONFIG_FILE).stat().st_mode & 0o777) == "0o600"
    # No default entry: the plain command has no key; the profile, by option or variable, has one.
    assert runner.invoke(main, ["status"]).exit_code == exitcodes.ERROR
    assert runner.invoke(main, ["--profile", "work", "status", "--json"]).exit_code == 0
    assert runner.invoke(main, ["status", "--json"], env={"TRAINFORGE_PROFILE": "work"}).exit_code == 0
    missing = runner.invoke(main, ["--profile", "home", "status"])
    assert missing.exit_code == exitcodes.ERROR and "no profile 'home'" in missing.stderr


def test_completion_script_and_job_ids(cli):  # noqa: F811
    script = cli.run("completion", "bash").stdout
    assert "_TRAINFORGE_COMPLETE" in script
    job_id = cli.json("submit", manifest(cli.tmp))["id"]
    result = cli.runner.invoke(main, [], env={"_TRAINFORGE_COMPLETE": "bash_complete", "COMP_WORDS": "trainforge cancel j-",
                                              "COMP_CWORD": "2"}, prog_name="trainforge")
    assert f"plain,{job_id}" in result.stdout.splitlines()


def test_labels_params_and_env_at_submit(cli):  # noqa: F811
    path = manifest(cli.tmp, "name: demo\nframework: custom\ncommand: python train.py {{lr}}\ncode: src\n"
                             "params: {lr: 1}\nlabels: {team: vision}\n")
    a = cli.json("submit", path, "--param", "lr=0.5", "-p", "epochs=3", "--env", "WANDB_MODE=offline")
    assert a["manifest"]["params"] == {"lr": 0.5, "epochs": 3}
    assert a["manifest"]["env"] == {"WANDB_MODE": "offline"}
    b = cli.json("submit", manifest(cli.tmp))
    assert [j["id"] for j in cli.json("status", "--label", "team=vision")] == [a["id"]]
    assert {j["id"] for j in cli.json("status")} == {a["id"], b["id"]}
    assert cli.json("status", "--label", "team=nlp") == []
    assert "is not KEY=VALUE" in cli.run("submit", path, "--param", "lr", code=exitcodes.USAGE).stderr


def test_status_lists_by_name_and_creation_time_and_follows_pages_with_all(cli):  # noqa: F811
    made = []
    for i, name in enumerate(("demo", "other", "demo")):
        made.append(cli.json("submit", manifest(cli.tmp, f"name: {name}\nframework: custom\ncommand: python train.py\n"))["id"])
        cli.trainer._jobs[made[-1]]["created_at"] = 1000.0 * (i + 1)  # fixed creation times for --since/--until

    def ids(*args):
        return [j["id"] for j in cli.json("status", *args)]

    assert ids("--name", "demo") == [made[2], made[0]]
    assert ids("--since", "2000") == [made[2], made[1]]
    assert ids("--until", "1970-01-01T00:33:20Z") == [made[0]]
    assert ids("--limit", "2") == [made[2], made[1]]
    assert ids("--limit", "1", "--all") == made[::-1]
    assert "more jobs match" in cli.run("status", "--limit", "2").stdout
    assert "more jobs match" not in cli.run("status", "--limit", "1", "--all").stdout
    cli.run("status", "--since", "yesterday", code=exitcodes.ERROR)


def test_status_changed_since_lists_what_changed_and_the_time_to_pass_next(cli):  # noqa: F811
    first = cli.json("submit", manifest(cli.tmp, "name: a\nframework: custom\ncommand: python train.py\n"))
    listed = cli.json("status", "--changed-since", "0")
    assert [j["id"] for j in listed["jobs"]] == [first["id"]] and listed["as_of"] > 0
    time.sleep(0.01)
    second = cli.json("submit", manifest(cli.tmp, "name: b\nframework: custom\ncommand: python train.py\n"))
    again = cli.json("status", "--changed-since", repr(listed["as_of"]), "--limit", "1")
    assert [j["id"] for j in again["jobs"]] == [second["id"]] and again["as_of"] >= listed["as_of"]
    text = cli.run("status", "--changed-since", repr(again["as_of"])).stdout
    assert text.splitlines()[-1].startswith("as of ") and "--changed-since " in text.splitlines()[-1]
    cli.run("status", "--changed-since", "-1", code=exitcodes.USAGE)
    cli.run("status", "--changed-since", "5", "--state", "queued", code=exitcodes.USAGE)


def test_up_and_down_without_the_server_dependencies_say_to_install_the_server_extra(tmp_path, monkeypatch):
    # a launcher that dies as a client-only install's does: importing a server dependency
    (tmp_path / "launcher_without_deps.py").write_text("import a_server_dependency_not_installed\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(stack, "_MODULE", "launcher_without_deps")
    runner = CliRunner(env={"TF_STATE_DIR": str(tmp_path / "state")})
    for command in ("up", "down"):
        result = runner.invoke(main, [command])
        assert result.exit_code == exitcodes.ERROR, result.output
        assert result.stderr.strip().splitlines() == [
            f"error: {stack.SERVER_EXTRA} (missing: a_server_dependency_not_installed)"]

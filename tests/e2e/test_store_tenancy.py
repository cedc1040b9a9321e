"""References to stored objects across teams, on the embedded stack (local backend, sandboxed learners).

A job reads its own team's objects and what a platform admin published to
its team; every other `store://` reference, in a job, an experiment or a
workflow, is refused at submit with the rule, and each refusal is in the
audit log naming the team, the key and the source (services/common/storeaccess.py).
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_embedded_stack import cli_json, run_cli, wait_terminal
from tests.tenancy import READS, Teams, job_manifest, published_read, refused_probes, submit, two_teams
from trainforge_services.devstack.components import BY_NAME
from trainforge_services.devstack.launcher import recorded_plan


@pytest.fixture(scope="module")
def teams(stack, tmp_path_factory) -> Teams:
    env, _, _ = stack
    return two_teams(env, tmp_path_factory.mktemp("teams"))


def test_another_teams_objects_are_refused_at_submit_and_each_refusal_is_audited(teams, tmp_path):
    answers = refused_probes(teams, tmp_path)
    assert "it names every team's jobs" in answers[2] and "the whole object store" in answers[3]
    assert f"{teams.secret_job} is not a job of team {teams.other_team}" in answers[0]
    entries = cli_json(teams.admin, "admin", "audit", "--team", teams.other_team, "--limit", "100")
    refused = [e for e in entries if e.get("refused")]
    assert len(refused) == len(answers) - 1  # all but the malformed store://jobs/./..., a 422
    assert all(e["status"] == 403 and e["team"] == teams.other_team and e["key_id"] for e in refused)
    named = {(r["field"], r["source"]) for e in refused for r in e["refused"]}
    assert named >= {("data[0].source", f"store://jobs/{teams.secret_job}/outputs/"),
                     ("data[0].source", "store://jobs/"), ("data[0].source", "store://")}
    assert all("published to its team" in r["rule"] for e in refused for r in e["refused"])
    # the job itself stays out of reach through every other door too
    for args in (("status", teams.secret_job), ("resume", teams.secret_job), ("logs", teams.secret_job),
                 ("download", teams.secret_job, "-o", str(tmp_path / "stolen"))):
        proc = run_cli(teams.other, *args, check=False)
        assert proc.returncode != 0 and teams.secret not in proc.stdout + proc.stderr, args


def test_a_published_prefix_is_read_and_after_withdrawal_refused(teams, stack, tmp_path):
    _, state, _ = stack
    job_id = published_read(teams, state, tmp_path)
    listing = cli_json(teams.admin, "admin", "published")
    prefix = next(p["prefix"] for p in listing if p["teams"] == [teams.other_team])
    cli_json(teams.admin, "admin", "published", "remove", prefix)
    proc = submit(teams.other, job_manifest(tmp_path, "after-withdrawal", READS, [{"source": prefix, "path": "got/"}]))
    assert proc.returncode != 0 and "published to it: none" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert cli_json(teams.other, "status", job_id)["state"] == "completed"
    for bad in ("store://jobs/", "store://", f"store://jobs/{teams.secret_job}/", "store://experiments/x/"):
        proc = run_cli(teams.admin, "admin", "published", "add", bad, "--everyone", check=False)
        assert proc.returncode != 0 and "prefix" in proc.stdout + proc.stderr, (bad, proc.stdout, proc.stderr)


def test_a_team_reads_its_own_jobs_outputs(teams, tmp_path):
    writes = "import os, pathlib\npathlib.Path(os.environ['TF_OUTPUT_DIR'], 'model.txt').write_text('weights')\n"
    first = cli_json(teams.other, "submit", str(job_manifest(tmp_path, "own-first", writes, [])))["id"]
    assert wait_terminal(teams.other, first, 180)["state"] == "completed"
    manifest = job_manifest(tmp_path, "own-second", READS, [{"source": f"store://jobs/{first}/outputs/", "path": "got/"}])
    second = cli_json(teams.other, "submit", str(manifest))["id"]
    assert wait_terminal(teams.other, second, 180)["state"] == "completed"
    lines = [line["line"] for line in cli_json(teams.other, "logs", second)["lines"]]
    assert "read 0/model.txt weights" in lines, lines


def test_an_experiment_or_workflow_naming_another_teams_job_is_refused(teams, tmp_path):
    code = tmp_path / "wf-code"
    code.mkdir()
    (code / "main.py").write_text(READS)
    stolen = [{"source": f"store://jobs/{teams.secret_job}/outputs/", "path": "got/"}]
    common = {"framework": "custom", "command": "python main.py", "resources": {"cpus": 0.5, "memory": "256Mi"}}
    recipes = {
        "experiment": {"kind": "experiment", "name": "steals", "code": str(code), **common, "data": stolen,
                       "parameters": {"lr": [0.1, 0.2]}},
        "workflow": {"kind": "workflow", "name": "steals-later", "code": str(code), "experiments": {
            "first": {**common}, "second": {**common, "data": stolen, "depends_on": ["first"]}}},
    }
    for kind, recipe in recipes.items():
        path = tmp_path / f"{kind}.json"
        path.write_text(json.dumps(recipe))
        proc = run_cli(teams.other, "submit", str(path), "--json", check=False)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "may not read" in text and teams.secret not in text, (kind, text)
        assert "data[0].source" in text, text
    # neither was stored: the refusal came before anything was
    assert cli_json(teams.other, "experiments") == [] and cli_json(teams.other, "workflows") == []


def test_an_environment_reaching_the_host_or_a_webhook_to_the_platform_is_refused(teams, stack, tmp_path):
    """The other places a job names, on the same stack: a requirements file's host paths, and webhooks to
    loopback, to a name resolving to it and to the API's own port (services/common/reqlines.py, destinations.py)."""
    _, state, _ = stack
    host_file = state / "stack.json"  # a file of the platform's, readable by the services
    probes = []
    for i, line in enumerate([f"-r {host_file}", f"-c {host_file}", f"-e file://{state}",
                              f"--find-links {state}", f"pkg @ file://{host_file}"]):
        code = tmp_path / f"req-{i}"
        code.mkdir()
        (code / "main.py").write_text("print('never runs')\n")
        (code / "requirements.txt").write_text(f"numpy\n{line}\n")
        path = tmp_path / f"req-{i}.json"
        path.write_text(json.dumps({"name": f"req-{i}", "framework": "custom", "command": "python main.py",
                                    "code": str(code), "requirements": "requirements.txt"}))
        probes.append((line, path))
    api_port = BY_NAME["api"].address(recorded_plan(state)).rsplit(":", 1)[1]
    for url in ("http://127.0.0.1:9/hook", "http://localhost:9/hook", f"http://127.0.0.1:{api_port}/v1/jobs",
                "http://169.254.169.254/latest/meta-data/"):
        path = tmp_path / f"hook-{len(probes)}.json"
        path.write_text(json.dumps({"name": "hooked", "framework": "custom", "command": "true",
                                    "notify": {"webhook": url}}))
        probes.append((url, path))
    stack_file = host_file.read_text()
    for what, path in probes:
        proc = run_cli(teams.other, "submit", str(path), "--json", check=False)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0, (what, text)
        assert ("requirements" in text and "line 2" in text) or "notify.webhook" in text, (what, text)
        assert stack_file not in text and teams.secret not in text
    stored = {j["name"] for j in cli_json(teams.other, "status")}
    assert "hooked" not in stored and not any(n.startswith("req-") for n in stored), stored

"""Experiments through the REST API and the CLI, against a real Trainer (scripted LCM) and real stores.

Tenancy as for jobs (another team's experiment is a 404 like a missing
one), validation errors naming fields (422), the code stored once for every
trial, and `trainforge submit` / `experiments` / `experiment ID` as people
and scripts use them.
"""

from __future__ import annotations

import json
import tarfile
from types import SimpleNamespace

import httpx
import pytest
from click.testing import CliRunner

from tests.integration.test_trainer_experiments import TEAM, Env
from tests.servers import serve_app, wait_for
from trainforge import config
from trainforge.cli import main
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings

RECIPE = """kind: experiment
name: sweep
framework: custom
command: python train.py --lr {{lr}}
code: src
parameters:
  lr: [0.1, 0.2, 0.3]
mode: grid
max_parallel: 3
objective: {metric: loss, goal: minimize}
"""


@pytest.fixture
def stack(mongo_server, osmem_server, mongo_db, unique, tmp_path):
    env = Env(mongo_server, osmem_server, unique, tmp_path)
    identity = IdentityStore(mongo_db)
    identity.create_team(TEAM)
    identity.create_team("other")
    key = identity.issue_key(TEAM, "cli", Role.MEMBER)
    other = identity.issue_key("other", "cli", Role.MEMBER)
    state = tmp_path / "state"
    objects = LocalStore(state / "objects")
    # the Trainer's state dir: the dev-mode service token it made there
    settings = ApiSettings(dev_mode=True, state_dir=env.settings.state_dir, trainer_address=env.trainer.address,
                           retention_interval=0)
    logs = LogStore(osmem_server.url, f"tf-logs-{unique}")
    app = create_app(settings, identity=identity, objects=objects, logs=logs)
    try:
        with serve_app(app) as url:
            config.save(state, config.Config(api_url=url, api_key=key, team=TEAM))
            runner = CliRunner(env={"TF_STATE_DIR": str(state), "TRAINFORGE_API_URL": None,
                                    "TRAINFORGE_API_KEY": None, "COLUMNS": "200"})

            def run(*args, code=0):
                result = runner.invoke(main, list(args), catch_exceptions=False)
                assert result.exit_code == code, (result.stdout, result.stderr)
                return result

            yield SimpleNamespace(env=env, run=run, url=url, key=key, other=other, objects=objects, tmp=tmp_path)
    finally:
        logs.close()
        env.close()


def write_recipe(tmp, text=RECIPE):
    (tmp / "src").mkdir(exist_ok=True)
    (tmp / "src" / "train.py").write_text("print('hi')\n")
    path = tmp / "sweep.yaml"
    path.write_text(text)
    return str(path)


def test_submit_follow_and_read_an_experiment_through_the_cli(stack):
    exp = json.loads(stack.run("submit", write_recipe(stack.tmp), "--json").stdout)
    assert exp["state"] == "running" and exp["trial_count"] == 3 and exp["code_uri"].endswith("/code.tar.gz")
    # the code is stored once, under the experiment, and every trial runs it
    archive = stack.objects.root / exp["code_uri"].removeprefix("store://")
    with tarfile.open(archive) as tar:
        assert "train.py" in tar.getnames()
    ids = [f"{exp['id']}-{i}" for i in range(3)]
    for job_id, loss in zip(ids, [0.4, 0.1, 0.3], strict=True):
        stack.env.run(job_id)
        assert stack.env.job(job_id).code_uri == exp["code_uri"]
        stack.env.report_metric(job_id, {"step": 1, "loss": loss})
        stack.env.complete(job_id)
    wait_for(lambda: json.loads(stack.run("experiment", exp["id"], "--json").stdout)["state"] == "completed", 20,
             "the experiment to complete")
    done = json.loads(stack.run("experiment", exp["id"], "--json").stdout)
    assert done["best_trial"] == 1
    assert [t["index"] for t in done["trials"]] == [1, 2, 0]  # sorted by the objective, best first
    assert [t["best"] for t in done["trials"]] == [True, False, False]
    table = stack.run("experiment", exp["id"]).stdout
    assert "best: trial 1" in table and "loss=0.1" in table and "lr=0.2" in table
    listing = stack.run("experiments").stdout
    assert exp["id"] in listing and "completed" in listing
    listed = json.loads(stack.run("experiments", "--json").stdout)
    assert [(e["id"], e["trial_count"], e["best_trial"], e["trials"]) for e in listed] == [(exp["id"], 3, 1, [])]


def test_experiments_are_tenant_scoped_and_bad_recipes_are_422_naming_fields(stack):
    exp = json.loads(stack.run("submit", write_recipe(stack.tmp), "--json").stdout)
    other = httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {stack.other}"})
    mine = httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {stack.key}"})
    try:
        for method, path in [("GET", ""), ("POST", "/halt"), ("POST", "/cancel"), ("POST", "/resume")]:
            r = other.request(method, f"/v1/experiments/{exp['id']}{path}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", (path, r.text)
        assert other.get("/v1/experiments").json() == {"experiments": []}
        r = mine.get("/v1/experiments/x-missing")
        assert r.status_code == 404
        bad = RECIPE.replace("max_parallel: 3", "max_parallel: 0").replace("goal: minimize", "goal: upward")
        r = mine.post("/v1/experiments", data={"recipe": bad})
        assert r.status_code == 422, r.text
        fields = {d["field"] for d in r.json()["error"]["details"]}
        assert {"max_parallel", "objective.goal"} <= fields
        assert mine.post(f"/v1/experiments/{exp['id']}/resume").json()["state"] == "running"  # a no-op
        assert mine.post(f"/v1/experiments/{exp['id']}/cancel").json()["state"] == "cancelled"
        r = mine.post(f"/v1/experiments/{exp['id']}/halt")
        assert r.status_code == 409 and "only a running experiment can be halted" in r.json()["error"]["message"]
    finally:
        other.close()
        mine.close()


def test_hypers_recipe_is_accepted_through_the_cli(stack):
    hyper = """experiments:
  sweep:
    framework: pytorch
    command: python train.py --lr {{lr}} --bs {{bs}}
    code: src
    samples: 4
    workers: 2
    hardware: cpu
    parameters:
      lr: {range: 0.01-0.1, sampling: log-uniform}
      bs: [16, 32]
"""
    exp = json.loads(stack.run("submit", write_recipe(stack.tmp, hyper), "--json").stdout)
    assert exp["trial_count"] == 4 and exp["spec"]["max_parallel"] == 2
    assert "translated" in exp["reason"] and "max_parallel" in exp["reason"]
    assert sorted(t["params"]["bs"] for t in exp["trials"]) == [16, 16, 32, 32]
    assert all(0.01 <= t["params"]["lr"] <= 0.1 for t in exp["trials"])


WORKFLOW = """kind: workflow
name: tune-then-train
code: src
experiments:
  sweep:
    framework: custom
    command: python train.py --lr {{lr}}
    parameters: {lr: [0.1, 0.2]}
    mode: grid
    objective: {metric: loss}
  train:
    framework: custom
    command: python train.py --long
    depends_on: [sweep]
"""


def test_workflows_through_the_cli_with_a_dag_view_tenancy_and_validation(stack):
    wf = json.loads(stack.run("submit", write_recipe(stack.tmp, WORKFLOW), "--json").stdout)
    assert [n["name"] for n in wf["nodes"]] == ["sweep", "train"] and wf["code_uri"].endswith("code.tar.gz")
    sweep = wait_for(lambda: json.loads(stack.run("workflow", wf["id"], "--json").stdout)["nodes"][0]["experiment_id"],
                     15, "the sweep to start")
    for index, loss in enumerate([0.5, 0.25]):
        job_id = f"{sweep}-{index}"
        stack.env.run(job_id)
        assert stack.env.job(job_id).code_uri == wf["code_uri"]
        stack.env.report_metric(job_id, {"step": 1, "loss": loss})
        stack.env.complete(job_id)
    wait_for(lambda: json.loads(stack.run("workflow", wf["id"], "--json").stdout)["nodes"][1]["experiment_id"], 15,
             "train to start")
    tree = stack.run("workflow", wf["id"]).stdout
    assert "tune-then-train" in tree and "sweep completed" in tree and "best trial 1" in tree
    assert "train running" in tree and "(take best)" in tree
    assert wf["id"] in stack.run("workflows").stdout
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {stack.other}"}) as other:
        assert other.get(f"/v1/workflows/{wf['id']}").status_code == 404
        assert other.post(f"/v1/workflows/{wf['id']}/cancel").status_code == 404
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {stack.key}"}) as mine:
        bad = WORKFLOW.replace("depends_on: [sweep]", "depends_on: [swep]")
        r = mine.post("/v1/workflows", data={"recipe": bad})
        assert r.status_code == 422
        assert {"field": "experiments.train.depends_on", "message": "unknown experiment 'swep'"} in \
            r.json()["error"]["details"]
    cancelled = json.loads(stack.run("workflow", wf["id"], "--cancel", "--json").stdout)
    assert cancelled["state"] == "cancelled"

"""Every route of the OpenAPI spec, called by team beta with team alpha's ids, reveals nothing.

The routes come from `app.openapi()["paths"]`, so a route added later is
covered without touching this file. Each operation states the role it needs
(`x-required-role`, published by the app factory from its dependencies):

* a team route (member, team_admin) with a path parameter filled with one
  of alpha's ids answers 404, exactly like a missing id, to beta's callers
  of sufficient role (and to a platform admin of a third team: team routes
  are about the caller's own team); a weaker caller gets 403;
* a platform-admin route answers 403 to beta's member and team admin;
* a route without path parameters answers beta without a trace of alpha's ids.

A path parameter this file cannot fill fails the test: teach FILL its name.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.integration.test_api_admin import make_platform
from tests.integration.test_trainer_dispatcher import ScriptedLcm
from trainforge_services.api.experiments import ExperimentCalls
from trainforge_services.api.identity import Role, key_id_of
from trainforge_services.common import rpcauth
from trainforge_services.common.settings import TrainerSettings
from trainforge_services.trainer.resources import BackendSize, Usage
from trainforge_services.trainer.wiring import serve

JOB = json.dumps({"name": "secret-model", "framework": "custom", "command": "true"})
PARAM = re.compile(r"\{([^}]+)\}")
RANK = {r.value: r.rank for r in Role}
# ids that exist nowhere, to compare each 404 with
MISSING = {"job_id": "j-ffffffffffff", "key_id": "0badf00d", "team": "no-such-team", "rank": "0",
           "path": "model.pt", "step": "1", "name": "no-such-secret", "experiment_id": "x-ffffffffffff",
           "workflow_id": "w-ffffffffffff"}
EXPERIMENT = json.dumps({"kind": "experiment", "name": "secret-sweep", "framework": "custom",
                         "command": "true {{lr}}", "parameters": {"lr": [1, 2]}})
WORKFLOW = json.dumps({"kind": "workflow", "name": "secret-flow", "experiments": {
    "a": {"framework": "custom", "command": "true"}, "b": {"framework": "custom", "command": "true",
                                                          "depends_on": ["a"]}}})
# Path parameters that name something inside the caller's own team (a secret's name), not an id of alpha's:
# another team using the same name reaches its own, so only leaks are checked for them.
OWN_NAMESPACE = {"name"}


@pytest.fixture
def p(mongo_server, osmem_server, mongo_db, logstore, tmp_path, unique):
    # experiments and workflows are served by a real Trainer (scripted LCM: nothing is deployed)
    settings = TrainerSettings(state_dir=tmp_path / "trainer", dev_mode=True, mongo_url=mongo_server.url,
                               mongo_db=f"tf{unique}", trainer_address="127.0.0.1:0",
                               logstore_url=osmem_server.url, logstore_index=f"tf-logs-{unique}")
    trainer = serve(settings, lcm=ScriptedLcm(BackendSize(Usage(cpus=8, memory=32 * 2**30, learners=8))))
    experiments = ExperimentCalls(trainer.address, authorization=rpcauth.service_authorization(settings))
    try:
        # every route for every key: far more requests than one key may make per second in production
        with make_platform(mongo_db, logstore, tmp_path, rate_limit_burst=100_000, rate_limit_per_second=100_000,
                           experiments=experiments) as platform:
            yield platform
    finally:
        experiments.close()
        trainer.stop(grace=0)


def operations(spec: dict):
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                yield path, method.upper(), op


def example_body(spec: dict, op: dict) -> dict | None:
    """The smallest JSON body the operation's schema accepts, or None when it takes no JSON body."""
    content = (op.get("requestBody") or {}).get("content") or {}
    if "application/json" not in content:
        return None
    return _example(spec, content["application/json"]["schema"])


def _example(spec: dict, schema: dict):  # noqa: ANN202
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return _example(spec, spec["components"]["schemas"][name])
    if "examples" in schema:
        return schema["examples"][0]
    if "default" in schema:
        return schema["default"]
    if "anyOf" in schema:
        return _example(spec, schema["anyOf"][0])
    kind = schema.get("type")
    if kind == "object":
        return {name: _example(spec, schema["properties"][name]) for name in schema.get("required", [])}
    if "enum" in schema:
        return schema["enum"][0]
    return {"string": "x", "integer": 1, "number": 1, "boolean": False, "array": [], "null": None}[kind]


def test_every_route_hides_another_teams_resources(p):
    # alpha's resources: a job, a key made over REST, the team itself
    job = p.client.post("/v1/jobs", data={"manifest": JOB}, headers=p.h["alpha_member"]).json()
    key = p.client.post("/v1/team/keys", json={"name": "alpha-ci"}, headers=p.h["alpha_admin"]).json()
    secret = "alpha-secret-value-0123456789"
    assert p.client.put("/v1/team/secrets/wandb", json={"value": secret}, headers=p.h["alpha_admin"]).is_success
    experiment = p.client.post("/v1/experiments", data={"recipe": EXPERIMENT}, headers=p.h["alpha_member"]).json()
    workflow = p.client.post("/v1/workflows", data={"recipe": WORKFLOW}, headers=p.h["alpha_member"]).json()
    fill = {"job_id": job["id"], "key_id": key["key_id"], "team": "alpha", "rank": "0", "path": "model.pt",
            "step": "1", "name": "wandb", "experiment_id": experiment["id"], "workflow_id": workflow["id"]}
    alpha_ids = [job["id"], key["key_id"], experiment["id"], workflow["id"], *(key_id_of(p.keys[k]) for k in ("alpha_member", "alpha_admin")),
                 secret]

    callers = {"beta member": ("beta_member", "member"), "beta team admin": ("beta_admin", "team_admin"),
               "ops platform admin": ("platform", "platform_admin")}
    spec = p.app.openapi()
    checked, problems = 0, []
    for path, method, op in operations(spec):
        names = PARAM.findall(path)
        required = op.get("x-required-role")
        if required is None:
            assert not path.startswith("/v1/") and not names, f"{method} {path} names no required role"
            continue
        unknown = [n for n in names if n not in fill]
        if unknown:
            pytest.fail(f"{method} {path}: no id of team alpha to put in path parameter(s) {unknown}; "
                        "add them to `fill` in this test")
        url = PARAM.sub(lambda m: fill[m.group(1)], path)
        body = example_body(spec, op)
        for caller, (who, role) in callers.items():
            if required == "platform_admin" and role == "platform_admin":
                continue  # platform admins manage every team: that is not a leak
            resp = p.client.request(method, url, headers=p.h[who], json=body)
            checked += 1
            if RANK[role] < RANK[required]:
                expected = 403
            elif [n for n in names if n not in OWN_NAMESPACE]:
                expected = 404
            else:
                expected = None  # no alpha id in the request: anything but a leak
            if expected is not None and resp.status_code != expected:
                problems.append(f"{caller}: {method} {url} -> {resp.status_code}, expected {expected}: {resp.text}")
            leaked = [i for i in alpha_ids if i in resp.text and not (names and resp.status_code == 404)]
            if leaked or (resp.status_code < 400 and '"alpha"' in resp.text):
                problems.append(f"{caller}: {method} {url} -> {resp.status_code} shows alpha's {leaked}: {resp.text}")
            if resp.status_code == 404:
                missing_url = PARAM.sub(lambda m: MISSING[m.group(1)], path)
                other = p.client.request(method, missing_url, headers=p.h[who], json=body)
                theirs = resp.json()["error"]["message"]
                for name in names:
                    theirs = theirs.replace(fill[name], MISSING[name])
                if other.status_code != 404 or other.json()["error"]["message"] != theirs:
                    problems.append(f"{caller}: {method} {url}: 404 differs from a missing id's: "
                                    f"{resp.text} vs {other.text}")
    assert not problems, "\n".join(problems)
    assert checked >= 40

    # and nothing of alpha's changed
    assert p.client.get(f"/v1/jobs/{job['id']}", headers=p.h["alpha_member"]).json()["state"] == "queued"
    keys = p.client.get("/v1/team/keys", headers=p.h["alpha_admin"]).json()["keys"]
    assert not any(k["revoked"] for k in keys)
    assert p.client.get("/v1/jobs", headers={"Authorization": f"Bearer {key['key']}"}).status_code == 200
    assert p.trainer.quota_requests == []
    got = p.client.get(f"/v1/experiments/{experiment['id']}", headers=p.h["alpha_member"]).json()
    assert got["state"] == "running"
    assert p.client.get(f"/v1/workflows/{workflow['id']}", headers=p.h["alpha_member"]).json()["state"] == "running"


def test_the_example_body_generator_satisfies_every_json_body(p):
    """So that a 422 can never stand in for the 404 or 403 the isolation test expects."""
    spec = p.app.openapi()
    for path, method, op in operations(spec):
        body = example_body(spec, op)
        if body is None:
            continue
        url = PARAM.sub(lambda m: {**MISSING, "team": "beta"}[m.group(1)], path)
        resp = p.client.request(method, url, headers=p.h["platform"], json=body)
        assert resp.status_code != 422, f"{method} {path}: {body} -> {resp.text}"

"""A manifest's env may name team secrets ({secret: name}); only the name is part of the job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.controller.learner import learner_env

MANIFEST = {"name": "a", "command": "true", "env": {"PLAIN": "1", "WANDB_API_KEY": {"secret": "wandb"}}}


def test_env_values_are_strings_or_secret_references():
    m = parse_manifest(json.dumps(MANIFEST))
    assert m.plain_env() == {"PLAIN": "1"} and m.secret_env() == {"WANDB_API_KEY": "wandb"}
    assert json.loads(m.model_dump_json())["env"]["WANDB_API_KEY"] == {"secret": "wandb"}


@pytest.mark.parametrize("bad", [{"secret": "Has Space"}, {"secret": ""}, {"secret": "x", "other": 1}, {"name": "x"}])
def test_bad_secret_references_are_named(bad):
    with pytest.raises(InvalidArgument, match="env.K"):
        parse_manifest(json.dumps({**MANIFEST, "env": {"K": bad}}))


def spec(secret_env: dict[str, str]) -> LearnerSpec:
    return LearnerSpec(job_id="j-1", attempt=1, rank=0, world_size=1, manifest=parse_manifest(json.dumps(MANIFEST)),
                       workdir=Path("/tmp/w"), secret_env=secret_env)


def test_the_learner_env_gets_the_values_and_the_spec_keeps_them_out_of_dumps_and_reprs():
    s = spec({"WANDB_API_KEY": "v4lue", "TF_JOB_ID": "nope"})
    env = learner_env(s, base={})
    assert env["WANDB_API_KEY"] == "v4lue" and env["PLAIN"] == "1" and env["TF_JOB_ID"] == "j-1"
    assert "v4lue" not in repr(s) and "v4lue" not in json.dumps(s.model_dump(mode="json"))
    # the spec file the controller reads carries them, and reads back
    assert LearnerSpec.parse(s.to_json()).secret_env == s.secret_env
    assert "secret_env" not in spec({}).to_json()

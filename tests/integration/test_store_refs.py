"""The Trainer's store-reference checks on a real MongoDB-wire server: owners, publications, and the grants a
deploy carries (services/trainer/storerefs.py, secret_env.py's ResolvingLcm)."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_team_secrets import RecordingLcm
from trainforge_services.common.errors import InvalidArgument, NotFound, PermissionDenied
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.trainer.secret_env import ResolvingLcm
from trainforge_services.trainer.storerefs import Publications, StoreOwners, StoreRefs

pytestmark = pytest.mark.integration


@pytest.fixture
def refs(mongo_db):
    mongo_db["jobs"].insert_many([{"_id": "j-vision", "team": "vision"}, {"_id": "j-nlp", "team": "nlp"}])
    mongo_db["experiments"].insert_one({"_id": "e-vision", "team": "vision"})
    mongo_db["workflows"].insert_one({"_id": "wf-vision", "team": "vision"})
    return StoreRefs(StoreOwners(mongo_db, jobs="jobs", experiments="experiments", workflows="workflows"),
                     Publications(mongo_db))


def manifest(*sources: str):
    return parse_manifest(json.dumps({"name": "m", "command": "true",
                                      "data": [{"source": s, "path": f"d{i}"} for i, s in enumerate(sources)]}))


def test_a_job_is_granted_its_teams_objects_and_published_prefixes(refs):
    refs.publications.put("store://datasets/mnist", ["vision"], "admin")
    got = refs.reads("vision", manifest("store://jobs/j-vision/outputs/", "store://datasets/mnist/train",
                                        "store://experiments/wf-vision/code.tar.gz"),
                     job_id="j-new", code_uri="store://experiments/e-vision/code.tar.gz")
    assert got == ["datasets/mnist/train", "experiments/e-vision/code.tar.gz",
                   "experiments/wf-vision/code.tar.gz", "jobs/j-vision/outputs"]
    # its own code archive needs no grant: the controller reads jobs/<id>/ anyway
    assert refs.reads("vision", manifest(), job_id="j-new", code_uri="store://jobs/j-new/code.tar.gz") == []
    with pytest.raises(PermissionDenied, match=r"code_uri: team nlp may not read .*e-vision is not an experiment"):
        refs.reads("nlp", manifest(), job_id="j-x", code_uri="store://experiments/e-vision/code.tar.gz")
    with pytest.raises(PermissionDenied, match=r"data\[1\]\.source: team nlp may not read store://datasets/mnist/"):
        refs.reads("nlp", manifest("store://jobs/j-nlp/outputs/", "store://datasets/mnist/"))


def test_publications_are_kept_replaced_and_withdrawn(refs):
    refs.publications.put("store://datasets/mnist/", ["vision", "nlp"], "admin")
    refs.publications.put("store://models/shared", ["*"], "admin")
    refs.publications.put("store://datasets/mnist", ["nlp"], "admin")  # replaces whom it is published to
    assert [(p.uri, sorted(p.teams)) for p in refs.publications.all()] == [
        ("store://datasets/mnist/", ["nlp"]), ("store://models/shared/", ["*"])]
    refs.publications.remove("store://datasets/mnist/")
    with pytest.raises(NotFound, match="is not published"):
        refs.publications.remove("store://datasets/mnist/")
    with pytest.raises(InvalidArgument, match="cannot be published"):
        refs.publications.put("store://jobs/j-nlp/", ["vision"], "admin")


def test_a_deploy_carries_the_grants_and_is_refused_once_a_publication_is_withdrawn(refs):
    inner = RecordingLcm()
    lcm = ResolvingLcm(inner, lambda team, names: {}, refs.reads)
    plain = manifest().model_dump_json()
    lcm.deploy_job("j-1", "vision", 1, plain, "store://jobs/j-1/code.tar.gz")
    assert inner.calls[-1][1] == {}  # a job naming nothing deploys exactly as before
    refs.publications.put("store://datasets/mnist/", ["vision"], "admin")
    reads = manifest("store://datasets/mnist/").model_dump_json()
    lcm.deploy_job("j-2", "vision", 1, reads, "", gated=True)
    assert inner.calls[-1][1] == {"reads": ["datasets/mnist"], "gated": True}
    refs.publications.remove("store://datasets/mnist/")
    with pytest.raises(PermissionDenied, match="published to it: none"):
        lcm.deploy_job("j-2", "vision", 2, reads, "")

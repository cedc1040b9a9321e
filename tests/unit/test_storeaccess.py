"""The store-reference rule (services/common/storeaccess.py): what a team's job may name in `store://`."""

from __future__ import annotations

import pytest

from trainforge_services.common.errors import InvalidArgument, PermissionDenied
from trainforge_services.common.storeaccess import (
    Publication,
    covered,
    grant,
    publication_prefix,
    publication_teams,
)


class Owners:
    jobs = {"j-vision": "vision", "j-nlp": "nlp"}
    experiments = {"e-vision": "vision", "wf-nlp": "nlp"}

    def job_team(self, job_id):
        return self.jobs.get(job_id)

    def experiment_team(self, experiment_id):
        return self.experiments.get(experiment_id)


PUBLISHED = [Publication("datasets/mnist/", frozenset({"vision"})), Publication("datasets/public/", frozenset("*")),
             Publication("models/nlp-only/", frozenset({"nlp"}))]


@pytest.mark.parametrize(("uri", "key"), [
    ("store://jobs/j-vision/outputs/", "jobs/j-vision/outputs"),
    ("store://jobs/j-vision/checkpoints/0/000000000010/", "jobs/j-vision/checkpoints/0/000000000010"),
    ("store://jobs/j-vision", "jobs/j-vision"),
    ("store://experiments/e-vision/code.tar.gz", "experiments/e-vision/code.tar.gz"),
    ("store://datasets/mnist", "datasets/mnist"),
    ("store://datasets/mnist/train/part-0", "datasets/mnist/train/part-0"),
    ("store://datasets/public/x", "datasets/public/x"),
])
def test_a_team_reads_its_own_objects_and_what_is_published_to_it(uri, key):
    assert grant("vision", uri, "data[0].source", Owners(), PUBLISHED) == key


@pytest.mark.parametrize(("uri", "why"), [
    ("store://jobs/j-nlp/outputs/", "j-nlp is not a job of team vision"),
    ("store://jobs/j-unknown/outputs/", "j-unknown is not a job of team vision"),  # the same words: ids not probed
    ("store://jobs/", "every team's jobs"),
    ("store://jobs", "every team's jobs"),
    ("store://experiments/", "every team's experiments"),
    ("store://experiments/wf-nlp/code.tar.gz", "wf-nlp is not an experiment or workflow of team vision"),
    ("store://", "the whole object store"),
    ("store:///", "the whole object store"),
    ("store://datasets", "not under a prefix published to team vision"),
    ("store://datasets/", "not under a prefix published to team vision"),
    ("store://datasets/mnist-private", "published to it: store://datasets/mnist/, store://datasets/public/"),
    ("store://models/nlp-only/", "not under a prefix published"),
])
def test_everything_else_is_refused_naming_the_field_the_source_and_the_rule(uri, why):
    with pytest.raises(PermissionDenied) as e:
        grant("vision", uri, "data[2].source", Owners(), PUBLISHED)
    assert why in e.value.message and e.value.message.startswith(f"data[2].source: team vision may not read {uri}")
    assert e.value.details == [{"field": "data[2].source", "message": e.value.details[0]["message"], "source": uri,
                                "rule": e.value.details[0]["rule"]}]
    assert "published to its team or to everyone" in e.value.details[0]["rule"]


@pytest.mark.parametrize("uri", ["s3://bucket/x", "store://jobs/../jobs/j-nlp", "store://jobs/./j-nlp/outputs",
                                 "store://datasets//mnist", "store://datasets\\\\mnist"])
def test_a_malformed_reference_is_invalid(uri):
    with pytest.raises(InvalidArgument, match=r"data\[0\]\.source"):
        grant("vision", uri, "data[0].source", Owners(), PUBLISHED)


def test_grants_cover_whole_segments_only():
    assert covered("datasets/mnist/a", ["datasets/mnist"]) and covered("datasets/mnist", ["datasets/mnist/"])
    assert not covered("datasets/mnist2/a", ["datasets/mnist"]) and not covered("datasets", ["datasets/mnist"])


@pytest.mark.parametrize(("uri", "message"), [
    ("store://jobs/", "cannot be published"), ("store://jobs/j-nlp/outputs/", "cannot be published"),
    ("store://experiments/x/", "cannot be published"), ("store://", "invalid key"), ("s3://b/x", "object-store URI"),
    ("store://datasets/../jobs/", "invalid key"),
])
def test_only_prefixes_outside_the_teams_own_objects_can_be_published(uri, message):
    with pytest.raises(InvalidArgument, match="prefix") as e:
        publication_prefix(uri)
    assert message in e.value.message


def test_a_publication_names_teams_or_everyone():
    assert publication_prefix("store://datasets/mnist") == publication_prefix("store://datasets/mnist/") == \
        "datasets/mnist/"
    assert publication_teams(["vision", " nlp "]) == {"vision", "nlp"} and publication_teams(["*"]) == {"*"}
    for bad in ([], [""], ["Not A Team"]):
        with pytest.raises(InvalidArgument, match="teams"):
            publication_teams(bad)

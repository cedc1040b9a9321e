"""A team's quota travels with every deploy: Trainer Quota -> DeployJobRequest.team_quota -> JobDeployment."""

from __future__ import annotations

import pytest

from trainforge_protos import lcm_pb2
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import Manifest
from trainforge_services.lcm.backends.base import TeamQuota
from trainforge_services.lcm.lifecycle.plan import deployment_from_request
from trainforge_services.trainer.lcm_client import team_quota_to_proto
from trainforge_services.trainer.resources import Quota

MANIFEST = Manifest(name="m", command="true").model_dump_json()


def request(**kw) -> lcm_pb2.DeployJobRequest:
    return lcm_pb2.DeployJobRequest(job_id="j-1", team="alpha", attempt=1, manifest_json=MANIFEST, **kw)


def test_the_trainers_quota_arrives_as_the_deployments_team_quota():
    quota = Quota(gpus=4, cpus=None, memory=2**34, jobs=0, gpus_by_type={"a100": 2})
    job = deployment_from_request(request(team_quota=team_quota_to_proto(quota)))
    assert job.team_quota == TeamQuota(gpus=4, memory=2**34, jobs=0, gpus_by_type={"a100": 2})
    assert job.team_quota.cpus is None  # no limit stays no limit (not 0)


def test_a_deploy_without_a_quota_has_none_and_an_empty_one_limits_nothing():
    assert deployment_from_request(request()).team_quota is None
    assert deployment_from_request(request(team_quota=team_quota_to_proto(Quota()))).team_quota == TeamQuota()


def test_a_negative_limit_is_refused_naming_the_field():
    with pytest.raises(InvalidArgument, match="invalid team_quota: gpus") as e:
        deployment_from_request(request(team_quota=lcm_pb2.TeamQuota(gpus=-1)))
    assert e.value.details[0]["field"] == "team_quota"

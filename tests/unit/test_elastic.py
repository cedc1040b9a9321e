"""Elastic jobs (manifest `learners: {min, max}`): validation, the plan, growth, the learner's env, the
monitor's rules, the kubernetes pod env and the REST world size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.backend import FakeBackend
from tests.fakes.coordinator import MemoryCoordinator
from tests.unit.test_kube_builders import OPTS, OWNER, env_of
from trainforge_frameworks.torch.launch import elastic_argv, elastic_env
from trainforge_protos import common_pb2
from trainforge_services.api.trainer_client import world_size_json
from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import Manifest, parse_manifest
from trainforge_services.common.states import JobState, LearnerState
from trainforge_services.controller.learner import learner_command, learner_env
from trainforge_services.jobmonitor.elastic import aggregate_elastic, world
from trainforge_services.lcm.backends.base import Site
from trainforge_services.lcm.backends.kubernetes import pods
from trainforge_services.lcm.lifecycle import JobDeployment, LifecycleManager, elastic
from trainforge_services.trainer.admission import demand

BASE = {"name": "el", "command": "python train.py", "resources": {"cpus": 1, "memory": "1Gi", "gpus": 1}}


def manifest(low: int = 2, high: int = 4) -> Manifest:
    return parse_manifest({**BASE, "learners": {"min": low, "max": high}})


# -- the manifest --------------------------------------------------------------------------------------------


def test_a_range_is_elastic_and_an_int_stays_a_fixed_size():
    m = manifest(2, 8)
    assert (m.elastic, m.min_learners, m.max_learners) == (True, 2, 8)
    assert parse_manifest(m.model_dump_json()) == m
    fixed = parse_manifest({**BASE, "learners": 3})
    assert (fixed.elastic, fixed.learners, fixed.min_learners, fixed.max_learners) == (False, 3, 3, 3)
    assert json.loads(fixed.model_dump_json())["learners"] == 3


@pytest.mark.parametrize(("learners", "field", "message"), [
    ({"min": 0, "max": 2}, "learners.min", "greater than or equal to 1"),
    ({"min": 3, "max": 2}, "learners.max", "must be at least min (3)"),
    ({"min": 2}, "learners.max", "Field required"),
    ({"min": 1, "max": 2, "step": 1}, "learners.step", "unknown field"),
    (0, "learners", "greater than or equal to 1"),
    ({"min": 1, "max": 65}, "learners.max", "less than or equal to 64"),
])
def test_a_bad_range_names_its_field(learners, field, message):
    with pytest.raises(InvalidArgument) as e:
        parse_manifest({**BASE, "learners": learners})
    assert [d["field"] for d in e.value.details] == [field]
    assert message in e.value.details[0]["message"]


def test_an_elastic_job_needs_torch():
    with pytest.raises(InvalidArgument, match="needs framework torch"):
        parse_manifest({**BASE, "framework": "custom", "learners": {"min": 1, "max": 2}})


def test_admission_holds_the_minimum():
    assert demand(manifest(2, 8)).gpus == 2
    assert demand(manifest(2, 8)).learners == 2


# -- the LCM: starting at the minimum, growing as far as granted, refilling a lost slot --------------------------


@pytest.fixture
def setup(tmp_path, monkeypatch):
    backend = FakeBackend(tmp_path / "work", gpus=4, max_learners=8)
    coord = MemoryCoordinator("/tf")
    lc = LifecycleManager(backend, coord, tmp_path / "state", lease_ttl=7, start_timeout=45, supervise_interval=3600)
    yield backend, coord, lc
    lc.close()


def deploy(lc: LifecycleManager, job_id: str, m: Manifest) -> None:
    lc.deploy(JobDeployment(job_id=job_id, team="team-a", attempt=1, manifest=m))


def test_an_elastic_job_starts_at_its_minimum_and_its_specs_say_so(setup):
    backend, _, lc = setup
    deploy(lc, "j-other", parse_manifest({**BASE, "learners": 1}))  # 1 of 4 GPUs taken
    deploy(lc, "j-el", manifest(2, 4))
    plan = backend.launched[-1]
    assert plan.world_size == 2 and plan.gpu_ids == ((1,), (2,))
    assert {s.world_size for s in plan.learners} == {4}  # ranks are slots 0..max-1
    assert (plan.monitor.learners, plan.monitor.min_learners, plan.monitor.max_learners) == (2, 2, 4)
    lc.supervise_once()
    assert backend.grown == [], "an elastic job grew into room the Trainer never granted"


def test_an_elastic_job_grows_as_far_as_granted_and_room_allows(setup):
    backend, _, lc = setup
    deploy(lc, "j-other", parse_manifest({**BASE, "learners": 2}))
    deploy(lc, "j-el", manifest(1, 4))
    assert backend.launched[-1].world_size == 1
    assert lc.grow("j-el", 1, 3) and not lc.grow("j-el", 2, 4) and not lc.grow("j-none", 1, 2)
    lc.supervise_once()
    assert backend.grown == [("j-el", [1])]  # granted 3, but only one GPU is free
    lc.kill("j-other")
    lc.supervise_once()
    assert backend.grown == [("j-el", [1]), ("j-el", [2])]  # up to the grant, not to the max
    assert lc.grow("j-el", 1, 9)  # a grant beyond the max is the max
    lc.supervise_once()
    assert backend.grown[-1] == ("j-el", [3])
    assert sorted(lc.view("j-el").names()) == ["controller-0", "controller-1", "controller-2", "controller-3",
                                              "monitor"]


def test_a_lost_slot_is_marked_starting_and_started_again_after_the_refill_delay(setup, monkeypatch):
    backend, coord, lc = setup
    deploy(lc, "j-el", manifest(1, 2))
    lc.grow("j-el", 1, 2)
    lc.supervise_once()
    backend.grown.clear()
    backend.die("j-el", "controller-1")
    lc.supervise_once()
    assert backend.grown == []
    status = LearnerStatus.parse(coord.get(coord.keys.learner_status("j-el", 1))[0])
    assert status.state == LearnerState.LEARNER_PREPARING and "starts in" in status.message
    monkeypatch.setattr(elastic.time, "monotonic", lambda: 1e12)  # the delay is over
    lc.supervise_once()
    assert backend.grown == [("j-el", [1])]


def test_no_growth_once_a_learner_completed(setup):
    backend, coord, lc = setup
    deploy(lc, "j-el", manifest(1, 4))
    lc.grow("j-el", 1, 4)
    lc.supervise_once()
    backend.grown.clear()
    backend.die("j-el", "controller-3")
    coord.put(coord.keys.learner_status("j-el", 0),
              LearnerStatus(state=LearnerState.LEARNER_COMPLETED, attempt=1, exit_code=0).value())
    lc.supervise_once()
    assert backend.grown == []
    # supervision reported the dead controller; nothing marks its slot as starting again
    assert LearnerStatus.parse(coord.get(coord.keys.learner_status("j-el", 3))[0]).state == LearnerState.LEARNER_FAILED


def test_the_team_quota_bounds_growth():
    from trainforge_services.lcm.backends.base import TeamQuota

    assert elastic.quota_room(TeamQuota(gpus=3), manifest(1, 8), [(manifest(1, 8), 1)]) == 2
    assert elastic.quota_room(TeamQuota(gpus=3), manifest(1, 8), [(manifest(1, 8), 3)]) == 0
    assert elastic.quota_room(None, manifest(1, 8), [(manifest(1, 8), 3)]) > 8


# -- the learner: a torchrun agent node --------------------------------------------------------------------------


def test_elastic_env_and_argv_are_torchruns_conventions():
    env = elastic_env(min_nodes=2, max_nodes=8, endpoint_host="10.0.0.7", endpoint_port=29555, run_id="j-1-3",
                      max_restarts=24, host_store=True, local_addr="10.0.0.9")
    assert env["PET_NNODES"] == "2:8" and env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == "10.0.0.7:29555" and env["PET_RDZV_ID"] == "j-1-3"
    assert env["PET_MAX_RESTARTS"] == "24" and env["PET_LOCAL_ADDR"] == "10.0.0.9"
    assert env["PET_RDZV_CONF"].startswith("is_host=1,")
    assert "is_host=0" in elastic_env(min_nodes=1, max_nodes=2, endpoint_host="h", endpoint_port=1, run_id="r",
                                      max_restarts=0, host_store=False)["PET_RDZV_CONF"]
    assert elastic_argv("python t.py") == ["python", "-m", "torch.distributed.run", "--no-python", "/bin/sh", "-c",
                                           "exec python t.py"]
    with pytest.raises(ValueError, match="max_nodes 1 must be at least min_nodes 2"):
        elastic_env(min_nodes=2, max_nodes=1, endpoint_host="h", endpoint_port=1, run_id="r", max_restarts=0,
                    host_store=False)


def test_the_learner_of_an_elastic_job_runs_torchrun_with_the_pet_env(tmp_path):
    m = manifest(1, 3)
    from trainforge_services.lcm.lifecycle import build_plan

    job = JobDeployment(job_id="j-1", team="t", attempt=2, manifest=m)
    plan = build_plan(job, Site(attempt_dir=tmp_path, master_addr="127.0.0.1", master_port=29555), [0, 1],
                      lease_ttl=10, start_timeout=30, size=2)
    spec = plan.learners[1]
    env = learner_env(spec, base={"PATH": "/bin"})
    assert "RANK" not in env and "WORLD_SIZE" not in env  # torchrun sets them per group
    assert env["PET_NNODES"] == "1:3" and env["PET_RDZV_ENDPOINT"] == "127.0.0.1:29555"
    assert env["PET_RDZV_ID"] == "j-1-2" and "is_host=0" in env["PET_RDZV_CONF"]
    assert env["PET_LOCAL_ADDR"].startswith("127.") and env["PET_LOCAL_ADDR"].endswith(".2")
    assert learner_command(spec).startswith("exec python -m torch.distributed.run --no-python /bin/sh -c ")


def test_kubernetes_learner_pods_carry_the_pet_env():
    from tests.unit.test_kube_builders import plan_for

    plan = plan_for(learners=2)
    fixed = env_of(pods.learner_pod(plan, OPTS, plan.learners[1], OWNER))
    assert fixed["RANK"] == "1" and "PET_NNODES" not in fixed
    job = JobDeployment(job_id="j-abc", team="team-a", attempt=3, manifest=manifest(2, 4))
    from trainforge_services.lcm.lifecycle import build_plan

    site = Site(attempt_dir=Path(OPTS.workdir) / "j-abc" / "3", master_addr="tf-j-abc-a3-r0.tf-j-abc-a3",
                master_port=29517)
    plan = build_plan(job, site, [0, 1, 2], lease_ttl=10, start_timeout=30, size=3)
    envs = [env_of(pods.learner_pod(plan, OPTS, spec, OWNER)) for spec in plan.learners]
    assert [e["PET_RDZV_CONF"].split(",")[0] for e in envs] == ["is_host=1", "is_host=0", "is_host=0"]
    for e in envs:
        assert e["PET_NNODES"] == "2:4" and e["PET_RDZV_BACKEND"] == "c10d"
        assert e["PET_RDZV_ENDPOINT"] == "tf-j-abc-a3-r0.tf-j-abc-a3:29517" and e["PET_RDZV_ID"] == "j-abc-3"
        assert "RANK" not in e and "PET_LOCAL_ADDR" not in e  # the pod's own name resolves


# -- the monitor and the REST shape ----------------------------------------------------------------------------


def st(state: LearnerState, attempt: int = 1, **kw) -> LearnerStatus:
    return LearnerStatus(state=state, attempt=attempt, **kw)


RUN, FAIL, DONE, PREP = (LearnerState.LEARNER_RUNNING, LearnerState.LEARNER_FAILED, LearnerState.LEARNER_COMPLETED,
                         LearnerState.LEARNER_PREPARING)


def test_a_lost_or_failed_learner_shrinks_the_job_while_min_remain():
    current = {0: st(RUN), 1: st(FAIL, exit_code=137), 2: st(RUN)}
    verdict = aggregate_elastic(current, slots=3, initial=3, minimum=2, attempt=1, last_seen=current)
    assert verdict.state == JobState.RUNNING and "1 left" in verdict.reason
    lost = {0: st(RUN)}  # slot 2's key vanished before it finished
    verdict = aggregate_elastic(lost, slots=3, initial=3, minimum=2, attempt=1, last_seen=current)
    assert verdict.state == JobState.FAILED and "fewer than the minimum 2" in verdict.reason
    assert world(current, 3, 1, current) == (2, 2)


def test_a_slot_starting_again_counts_in_the_target_not_the_current_size():
    current = {0: st(RUN), 1: st(PREP)}
    assert world(current, 2, 1, current) == (1, 2)
    assert aggregate_elastic(current, slots=2, initial=2, minimum=1, attempt=1,
                             last_seen=current).state == JobState.RUNNING


def test_the_job_completes_when_every_learner_still_in_it_completed():
    current = {0: st(DONE, exit_code=0), 1: st(FAIL, exit_code=1), 2: st(DONE, exit_code=0)}
    verdict = aggregate_elastic(current, slots=3, initial=3, minimum=1, attempt=1, last_seen=current)
    assert verdict.state == JobState.COMPLETED


def test_the_rest_shape_shows_current_and_target_sizes():
    m = manifest(1, 3)
    job = common_pb2.Job(id="j-1", attempt=1, manifest_json=m.model_dump_json(), learners=[
        common_pb2.LearnerStatus(rank=0, state=RUN, attempt=1), common_pb2.LearnerStatus(rank=1, state=PREP, attempt=1),
        common_pb2.LearnerStatus(rank=2, state=FAIL, attempt=1)])
    assert world_size_json(job) == {"current": 1, "target": 2, "min": 1, "max": 3}
    fixed = common_pb2.Job(id="j-2", manifest_json=parse_manifest({**BASE, "learners": 2}).model_dump_json())
    assert world_size_json(fixed) is None

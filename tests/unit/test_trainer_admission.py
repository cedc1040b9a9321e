"""Admission arithmetic: what fits, the words a user reads, queue order and positions."""

import pytest

from trainforge_services.common.manifest import parse_manifest
from trainforge_services.trainer import admission
from trainforge_services.trainer.resources import BackendSize, Queued, Usage

GI = 2**30
CAPACITY = BackendSize(Usage(gpus=2, cpus=8, memory=32 * GI, learners=4), backend="local")


def job(job_id: str, team: str = "a", *, gpus: int = 0, cpus: float = 1, memory: int = GI, learners: int = 1,
        priority: int = 1, created_at: float = 0.0) -> Queued:
    return Queued(job_id, team, Usage(gpus, cpus, memory, learners), priority, created_at)


def test_demand_counts_every_learner():
    m = parse_manifest({"name": "x", "command": "true", "learners": 3,
                        "resources": {"gpus": 1, "cpus": 1.5, "memory": "2Gi"}})
    assert admission.demand(m) == Usage(gpus=3, cpus=4.5, memory=6 * GI, learners=3)


def test_demand_may_exceed_the_per_learner_limits():
    # the manifest's limits are per learner; a job's totals may go past them
    m = parse_manifest({"name": "x", "command": "true", "learners": 16,
                        "resources": {"gpus": 8, "cpus": 200, "memory": "16Ti"}})
    assert admission.demand(m) == Usage(gpus=128, cpus=3200, memory=16 * 16 * 2**40, learners=16)


@pytest.mark.parametrize(("n", "text"), [
    (512, "512B"), (2 * 2**10, "2Ki"), (1536 * 2**20, "1.5Gi"), (4 * GI, "4Gi"), (3 * 2**40, "3Ti"),
])
def test_format_memory(n, text):
    assert admission.format_memory(n) == text


def test_shortfall_names_the_resource_the_limit_and_the_use():
    need = Usage(cpus=4, memory=GI, learners=1)
    assert admission.shortfall(need, Usage(cpus=2, memory=8 * GI, learners=8), Usage(cpus=1.5)) == \
        "needs 4 CPUs; capacity 2, in use 1.5"
    assert admission.shortfall(Usage(gpus=1), Usage(gpus=8), Usage(gpus=8), "team quota") == \
        "needs 1 GPU; team quota 8, in use 8"
    assert admission.shortfall(Usage(memory=8 * GI), Usage(memory=16 * GI), Usage(memory=12 * GI)) == \
        "needs 8Gi of memory; capacity 16Gi, in use 12Gi"


def test_fits_exactly_and_with_fractional_cpus():
    limit = Usage(cpus=0.3, learners=3)
    assert admission.shortfall(Usage(cpus=0.1, learners=1), limit, Usage(cpus=0.1) + Usage(cpus=0.1)) is None
    assert admission.shortfall(Usage(cpus=2, learners=1), Usage(cpus=4, learners=2),
                               Usage(cpus=2, learners=1)) is None


def test_a_resource_the_job_does_not_ask_for_never_blocks_it():
    assert admission.shortfall(Usage(cpus=1), Usage(gpus=0, cpus=4), Usage(gpus=3, cpus=0)) is None


def test_too_big_lists_every_resource_beyond_the_backend():
    problems = admission.too_big(Usage(gpus=8, cpus=16, memory=GI, learners=5), CAPACITY)
    assert problems == {
        "gpus": "needs 8 GPUs but the backend has 2",
        "cpus": "needs 16 CPUs but the backend has 8",
        "learners": "needs 5 learners but the backend runs at most 4 at once",
    }
    no_gpus = BackendSize(Usage(gpus=0, cpus=8, memory=GI, learners=4))
    assert admission.too_big(Usage(gpus=8, cpus=1, memory=GI, learners=1), no_gpus) == \
        {"gpus": "needs 8 GPUs but the backend has 0"}
    assert admission.too_big(Usage(gpus=2, cpus=8, memory=32 * GI, learners=4), CAPACITY) == {}


def test_queue_order_is_priority_then_first_come():
    jobs = [job("late-high", priority=2, created_at=3), job("early", created_at=1),
            job("low", priority=0, created_at=0), job("later", created_at=2)]
    assert [q.job_id for q in admission.queue_order(jobs)] == ["late-high", "early", "later", "low"]


def test_plan_dispatches_what_fits_and_lets_small_jobs_pass_a_waiting_big_one():
    queue = [job("big", cpus=6, created_at=1), job("small", cpus=2, created_at=2),
             job("more", cpus=3, created_at=3)]
    result = admission.plan(queue, in_use=Usage(cpus=4, learners=1), capacity=CAPACITY)
    assert result.dispatch == ["small"]
    assert result.wait == {"big": ("needs 6 CPUs; capacity 8, in use 6", 1),
                           "more": ("needs 3 CPUs; capacity 8, in use 6", 2)}
    assert result.reject == {}


def test_plan_positions_count_within_each_team():
    queue = [job("a1", "a", gpus=2, created_at=1), job("b1", "b", gpus=2, created_at=2),
             job("a2", "a", gpus=1, created_at=3), job("b2", "b", gpus=1, created_at=4)]
    result = admission.plan(queue, in_use=Usage(gpus=2), capacity=CAPACITY)
    assert {k: pos for k, (_, pos) in result.wait.items()} == {"a1": 1, "b1": 1, "a2": 2, "b2": 2}


def test_plan_rejects_what_can_never_run_instead_of_queueing_it():
    result = admission.plan([job("huge", gpus=3)], in_use=Usage(), capacity=CAPACITY)
    assert result.reject == {"huge": "needs 3 GPUs but the backend has 2"}
    assert result.dispatch == [] and result.wait == {}


def test_plan_counts_learners_against_max_learners():
    result = admission.plan([job("x", learners=2)], in_use=Usage(learners=3), capacity=CAPACITY)
    assert result.wait == {"x": ("needs 2 learners; capacity 4, in use 3", 1)}


def test_hold_keeps_everyone_waiting_in_order():
    queue = [job("b", created_at=2), job("a", created_at=1), job("c", "other", created_at=0)]
    result = admission.hold(queue, "waiting for the LCM: down")
    assert result.wait == {"c": ("waiting for the LCM: down", 1), "a": ("waiting for the LCM: down", 1),
                           "b": ("waiting for the LCM: down", 2)}


def test_waiting_reasons_have_a_kind_for_the_admission_metrics():
    assert admission.reason_kind("needs 2 GPUs; team quota 4, in use 4") == "quota"
    assert admission.reason_kind("waiting for the LCM: unavailable") == "lcm"
    assert admission.reason_kind("needs 2 GPUs; 1 of 4 free") == "capacity"

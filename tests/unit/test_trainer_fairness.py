"""Who goes next: team quotas, fair turns between teams, priorities, FIFO and queue positions.

Concrete scenarios on the pure `admission.plan`; the dispatcher only feeds it
what the store holds, so these decide what users see.
"""

import pytest

from trainforge_services.trainer import admission
from trainforge_services.trainer.resources import BackendSize, Queued, Quota, TeamUse, Usage

GI = 2**30
CPUS4 = BackendSize(Usage(gpus=0, cpus=4, memory=64 * GI, learners=64))
BIG = BackendSize(Usage(gpus=16, cpus=64, memory=256 * GI, learners=64))


def job(job_id: str, team: str, created_at: float, *, gpus: int = 0, cpus: float = 1, memory: int = GI,
        priority: int = 1, gpu_type: str = "") -> Queued:
    return Queued(job_id, team, Usage(gpus, cpus, memory, 1), priority, created_at, gpu_type)


def holding(*needs: Usage, gpu_type: str = "") -> TeamUse:
    use = TeamUse()
    for need in needs:
        use = use.add(need, gpu_type)
    return use


def running(n: int, **kw) -> TeamUse:
    return holding(*[Usage(memory=GI, learners=1, **kw)] * n)


def plan(queue, teams=None, capacity=CPUS4, quotas=None):
    teams = teams or {}
    in_use = admission.total(use.usage for use in teams.values())
    return admission.plan(queue, in_use, capacity, quotas=quotas, teams=teams)


def test_a_team_flooding_the_queue_does_not_push_another_teams_job_back():
    flood = [job(f"a{i}", "a", created_at=i) for i in range(1, 51)]
    late = job("b1", "b", created_at=100)
    # team a holds 3 of the 4 CPUs: the one free slot goes to b, which holds nothing
    result = plan([*flood, late], {"a": running(3, cpus=1)})
    assert result.dispatch == ["b1"]
    assert result.wait["a1"] == ("needs 1 CPU; capacity 4, in use 4", 1)
    assert result.wait["a50"][1] == 50
    # two free slots: b first (least share), then a's oldest
    result = plan([*flood, late], {"a": running(2, cpus=1)})
    assert result.dispatch == ["b1", "a1"]
    assert result.wait["a2"] == ("needs 1 CPU; capacity 4, in use 4", 1)


def test_teams_take_turns_by_least_share_then_oldest_waiting_job():
    queue = ([job(f"a{i}", "a", created_at=i) for i in range(1, 6)]
             + [job(f"b{i}", "b", created_at=10 + i) for i in range(1, 6)] + [job("c1", "c", created_at=20)])
    result = plan(queue)
    # nobody holds anything: the oldest job starts, then each other team gets its turn
    assert result.dispatch == ["a1", "b1", "c1", "a2"]
    assert {k: pos for k, (_, pos) in result.wait.items()} == {
        "a3": 1, "a4": 2, "a5": 3, "b2": 1, "b3": 2, "b4": 3, "b5": 4}


def test_share_is_the_dominant_resource():
    capacity = BackendSize(Usage(gpus=2, cpus=8, memory=64 * GI, learners=64))
    # a holds half the GPUs, b three eighths of the CPUs: b is further from its fair share
    teams = {"a": holding(Usage(gpus=1, cpus=1, learners=1)), "b": holding(Usage(cpus=3, learners=1))}
    assert admission.dominant_share(teams["a"].usage, capacity.total) == 0.5
    assert admission.dominant_share(teams["b"].usage, capacity.total) == 0.375
    queue = [job("a1", "a", created_at=1, cpus=4), job("b1", "b", created_at=2, cpus=4)]
    assert plan(queue, teams, capacity).dispatch == ["b1"]


def test_priority_comes_before_fairness():
    teams = {"a": running(2, cpus=1)}
    queue = [job("b-normal", "b", created_at=1), job("a-high", "a", created_at=5, priority=2),
             job("a-low", "a", created_at=0, priority=0)]
    result = plan(queue, teams, quotas=None)
    assert result.dispatch == ["a-high", "b-normal"]
    assert result.wait == {"a-low": ("needs 1 CPU; capacity 4, in use 4", 1)}


def test_first_come_first_served_within_a_team():
    queue = [job("second", "a", created_at=2), job("third", "a", created_at=3), job("first", "a", created_at=1)]
    result = plan(queue, {"a": running(2, cpus=1)})
    assert result.dispatch == ["first", "second"]
    assert result.wait == {"third": ("needs 1 CPU; capacity 4, in use 4", 1)}


def test_a_job_waits_for_its_team_quota_with_the_limit_in_its_reason():
    quotas = {"a": Quota(gpus=4)}
    teams = {"a": running(1, gpus=2)}
    queue = [job("a1", "a", 1, gpus=2), job("a2", "a", 2, gpus=1), job("b1", "b", 3, gpus=4)]
    result = plan(queue, teams, BIG, quotas)
    # a's quota is full once a1 runs; a2 waits on it while b, without a quota, still starts
    assert result.dispatch == ["b1", "a1"]
    assert result.wait == {"a2": ("needs 1 GPU; team quota 4, in use 4", 1)}


def test_a_quota_is_spent_within_one_pass():
    quotas = {"a": Quota(gpus=3, jobs=5)}
    queue = [job("a1", "a", 1, gpus=2), job("a2", "a", 2, gpus=2), job("a3", "a", 3, gpus=1)]
    result = plan(queue, {}, BIG, quotas)
    assert result.dispatch == ["a1", "a3"]
    assert result.wait == {"a2": ("needs 2 GPUs; team quota 3, in use 3", 1)}


@pytest.mark.parametrize(("quota", "reason"), [
    (Quota(cpus=2.5), "needs 1 CPU; team quota 2.5, in use 2"),
    (Quota(memory=2 * GI), "needs 1Gi of memory; team quota 2Gi, in use 2Gi"),
    (Quota(jobs=2), "needs a job slot; team quota 2 jobs, in use 2"),
])
def test_every_quota_resource_is_named(quota, reason):
    result = plan([job("a3", "a", 3)], {"a": running(2, cpus=1)}, BIG, {"a": quota})
    assert result.wait == {"a3": (reason, 1)}


def test_gpus_of_a_type_count_against_the_type_and_all_gpus():
    quotas = {"a": Quota(gpus=8, gpus_by_type={"a100": 2})}
    teams = {"a": holding(Usage(gpus=1, learners=1), gpu_type="a100")}
    queue = [job("typed", "a", 1, gpus=2, gpu_type="a100"), job("other", "a", 2, gpus=2, gpu_type="h100"),
             job("any", "a", 3, gpus=2)]
    result = plan(queue, teams, BIG, quotas)
    assert result.dispatch == ["other", "any"]
    assert result.wait == {"typed": ("needs 2 a100 GPUs; team quota for a100 2, in use 1", 1)}
    # the types add up under `gpus` too
    result = plan(queue, teams, BIG, {"a": Quota(gpus=3, gpus_by_type={"a100": 4})})
    assert result.dispatch == ["typed"]
    assert result.wait["other"] == ("needs 2 GPUs; team quota 3, in use 3", 1)


def test_another_teams_quota_does_not_hold_a_team_back():
    quotas = {"a": Quota(cpus=1)}
    queue = [job("a1", "a", 1), job("a2", "a", 2), job("b1", "b", 3), job("b2", "b", 4)]
    result = plan(queue, {}, CPUS4, quotas)
    assert result.dispatch == ["a1", "b1", "b2"]
    assert result.wait == {"a2": ("needs 1 CPU; team quota 1, in use 1", 1)}


def test_quota_reason_comes_before_capacity_and_is_worded_after_the_pass():
    quotas = {"a": Quota(cpus=2)}
    queue = [job("a1", "a", 1), job("a2", "a", 2), job("b1", "b", 3, cpus=3)]
    result = plan(queue, {"a": running(1, cpus=1)}, CPUS4, quotas)
    assert result.dispatch == ["b1"]  # b holds nothing: its turn comes first
    assert result.wait == {"a1": ("needs 1 CPU; capacity 4, in use 4", 1),
                           "a2": ("needs 1 CPU; capacity 4, in use 4", 2)}
    result = plan(queue, {"a": running(2, cpus=1)}, BackendSize(Usage(cpus=16, memory=GI * 64, learners=9)), quotas)
    assert result.wait["a1"] == ("needs 1 CPU; team quota 2, in use 2", 1)


def test_a_job_bigger_than_its_whole_quota_is_rejected_not_queued():
    quotas = {"a": Quota(gpus=4, cpus=8, gpus_by_type={"a100": 1})}
    queue = [job("huge", "a", 1, gpus=8), job("typed", "a", 2, gpus=2, gpu_type="a100"), job("ok", "a", 3, gpus=4)]
    result = plan(queue, {}, BIG, quotas)
    assert result.reject == {"huge": "needs 8 GPUs but team quota is 4",
                             "typed": "needs 2 a100 GPUs but team quota for a100 is 1"}
    assert result.dispatch == ["ok"]


def test_beyond_quota_lists_every_field():
    quota = Quota(gpus=1, cpus=2, memory=GI, jobs=0)
    assert admission.beyond_quota(Usage(gpus=2, cpus=4, memory=2 * GI, learners=1), "", quota) == {
        "gpus": "needs 2 GPUs but team quota is 1", "cpus": "needs 4 CPUs but team quota is 2",
        "memory": "needs 2Gi of memory but team quota is 1Gi", "jobs": "team quota allows no running jobs"}
    assert admission.beyond_quota(Usage(gpus=1, cpus=2, memory=GI), "", Quota(gpus=1, cpus=2, memory=GI)) == {}


def test_a_quota_lowered_below_what_runs_keeps_the_rest_waiting():
    result = plan([job("a3", "a", 3, gpus=1)], {"a": running(3, gpus=2)}, BIG, {"a": Quota(gpus=4)})
    assert result.wait == {"a3": ("needs 1 GPU; team quota 4, in use 6", 1)}


def test_positions_follow_each_teams_own_order():
    queue = [job("a2", "a", 2), job("b1", "b", 1), job("a1", "a", 1), job("a-high", "a", 9, priority=2)]
    assert admission.positions(queue) == {"a-high": 1, "a1": 2, "a2": 3, "b1": 1}


def test_team_use_adds_up_active_jobs():
    use = admission.team_use([("a", Usage(2, 1, GI, 2), "a100"), ("a", Usage(1, 1, GI, 1), ""),
                              ("b", Usage(0, 4, GI, 1), "")])
    assert use["a"] == TeamUse(Usage(3, 2, 2 * GI, 3), 2, {"a100": 2})
    assert use["b"].jobs == 1 and use["b"].gpus_by_type == {}

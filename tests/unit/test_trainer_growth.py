"""The Trainer's grants to elastic jobs (services/trainer/growth.py): counted like admission, never ahead of
the queue."""

from __future__ import annotations

from trainforge_services.common.states import JobState
from trainforge_services.trainer.growth import grants, per_learner
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.resources import BackendSize, Quota, Usage

GI = 2**30
CAPACITY = BackendSize(Usage(gpus=8, cpus=64, memory=256 * GI, learners=16))


def elastic(job_id: str, team: str = "team-a", low: int = 2, high: int = 8, grown: int = 0,
            state: JobState = JobState.RUNNING, since: float = 100.0) -> JobRecord:
    return JobRecord(id=job_id, team=team, state=state, resources=Usage(low, 2.0 * low, 4 * GI * low, low),
                     max_learners=high, grown=Usage(grown, 2.0 * grown, 4 * GI * grown, grown),
                     active_since=since, attempt=1)


def fixed(job_id: str, gpus: int, team: str = "team-b") -> JobRecord:
    return JobRecord(id=job_id, team=team, state=JobState.RUNNING, resources=Usage(gpus, 1.0, GI, 1))


def test_with_an_empty_queue_an_elastic_job_is_granted_what_is_free_up_to_its_max():
    [grant] = grants([elastic("el"), fixed("other", gpus=3)], CAPACITY, {})
    assert (grant.job_id, grant.learners, grant.was) == ("el", 5, Usage())
    assert grant.grown == Usage(3, 6.0, 12 * GI, 3)  # 2 + 3 held + 3 more = all 8 GPUs
    [grant] = grants([elastic("el", high=4)], CAPACITY, {})
    assert grant.learners == 4, "never beyond its max"


def test_what_was_granted_counts_as_held():
    assert grants([elastic("el", grown=6)], CAPACITY, {}) == []  # 2 + 6 = the whole backend
    [grant] = grants([elastic("el", grown=2)], CAPACITY, {})
    assert grant.learners == 8 and grant.was == Usage(2, 4.0, 8 * GI, 2)


def test_a_job_waiting_for_capacity_stops_all_growth():
    active = [elastic("el"), fixed("other", gpus=3)]
    assert grants(active, CAPACITY, {}, waiting=[("team-b", "capacity")]) == []
    assert grants(active, CAPACITY, {}, waiting=[("team-a", "preemption")]) == []


def test_a_job_waiting_for_its_team_quota_stops_only_its_teams_growth():
    active = [elastic("a1", high=4), elastic("b1", team="team-b", high=4, since=200.0)]
    assert grants(active, CAPACITY, {}, waiting=[("team-a", "quota")])[0].job_id == "b1"
    assert [g.job_id for g in grants(active, CAPACITY, {}, waiting=[("team-c", "quota")])] == ["a1", "b1"]


def test_the_oldest_running_job_grows_first_and_the_next_gets_the_rest():
    old, new = elastic("old", since=1.0), elastic("new", since=2.0)
    [first] = grants([new, old], CAPACITY, {})
    assert (first.job_id, first.learners) == ("old", 6)  # 2 + 2 held: the 4 free GPUs go to it
    then = grants([new, old.model_copy(update={"max_learners": 3})], CAPACITY, {})
    assert [(g.job_id, g.learners) for g in then] == [("old", 3), ("new", 5)]


def test_the_team_quota_bounds_growth_but_the_jobs_slot_is_its_own():
    quotas = {"team-a": Quota(gpus=5, jobs=1)}
    [grant] = grants([elastic("el")], CAPACITY, quotas)
    assert grant.learners == 5


def test_only_running_elastic_jobs_grow():
    deploying = elastic("el", state=JobState.DEPLOYING)
    assert grants([deploying, fixed("f", gpus=1)], CAPACITY, {}) == []


def test_one_learners_share():
    assert per_learner(Usage(4, 8.0, 16 * GI, 4)) == Usage(1, 2.0, 4 * GI, 1)

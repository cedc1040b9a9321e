"""Victim selection: who is halted for whom, how many, and the guard rails."""

from trainforge_services.trainer.preemption import Policy, Running, choose
from trainforge_services.trainer.resources import BackendSize, Queued, Quota, Usage

NOW = 1000.0
BIG = BackendSize(Usage(gpus=16, cpus=64, memory=0, learners=32))
LAB = {"a": Quota(gpus=2, cohort="lab"), "b": Quota(gpus=4, cohort="lab")}
POLICY = Policy(min_runtime=60, max_preemptions=2)


def run(job_id: str, team: str, gpus: int, *, priority: int = 1, started: float = 0.0, **kw) -> Running:
    return Running(job_id, team, Usage(gpus=gpus, learners=1), priority, started=started, **kw)


def wait(job_id: str, team: str, gpus: int, *, priority: int = 1) -> Queued:
    return Queued(job_id, team, Usage(gpus=gpus, learners=1), priority, NOW)


def victims(outcome) -> list[list[str]]:
    return [[v.job_id for v in d.victims] for d in outcome.decisions]


def test_the_owner_reclaims_from_borrowers_newest_first_and_only_as_many_as_needed():
    # a holds 2 of its own and borrows 3 of b's 4 (three 1-GPU jobs beyond its quota): b has 1 unused
    running = [run("a-own", "a", 2, started=10), run("a1", "a", 1, started=20), run("a2", "a", 1, started=30),
               run("a3", "a", 1, started=40)]
    outcome = choose([wait("b1", "b", 3)], running, LAB, BIG, POLICY, NOW)
    assert victims(outcome) == [["a3", "a2"]]
    decision = outcome.decisions[0]
    assert decision.reclaim and decision.team == "b" and decision.returned == Usage(gpus=2, learners=2)


def test_a_team_that_is_not_borrowing_is_not_a_victim_of_a_reclaim():
    running = [run("a-own", "a", 2), run("b-own", "b", 4)]
    assert choose([wait("b1", "b", 1)], running, LAB, BIG, POLICY, NOW).decisions == []


def test_a_higher_priority_job_displaces_lower_priority_ones_borrowers_first():
    quotas = {"a": Quota(gpus=4)}
    running = [run("low-old", "a", 2, started=10), run("low-new", "a", 2, started=20),
               run("mid", "a", 0, priority=2, started=30)]
    outcome = choose([wait("high", "a", 2, priority=3)], running, quotas, BIG, POLICY, NOW)
    assert victims(outcome) == [["low-new"]] and not outcome.decisions[0].reclaim
    # equal priority: nobody is displaced
    assert choose([wait("same", "a", 2)], running, quotas, BIG, POLICY, NOW).decisions == []


def test_backend_capacity_shortage_is_answered_by_priority_across_teams():
    small = BackendSize(Usage(gpus=4, cpus=64, memory=0, learners=32))
    running = [run("x", "a", 2, started=10), run("y", "b", 2, started=20, priority=2)]
    outcome = choose([wait("urgent", "c", 2, priority=3)], running, {}, small, POLICY, NOW)
    assert victims(outcome) == [["x"]]  # lowest priority first, whichever is newer


def test_minimum_runtime_and_the_preemption_bound_protect_a_job():
    running = [run("a-own", "a", 2, started=NOW - 5), run("young", "a", 1, started=NOW - 10), run("often", "a", 1, preemptions=2),
               run("ok", "a", 1, started=5)]
    # b has 1 GPU unused: 3 GPUs need 2 returned, but only "ok" qualifies
    assert victims(choose([wait("b1", "b", 3)], running, LAB, BIG, POLICY, NOW)) == []
    assert victims(choose([wait("b1", "b", 2)], running, LAB, BIG, POLICY, NOW)) == [["ok"]]


def test_no_preemption_for_a_job_that_would_still_not_fit():
    quotas = {"a": Quota(gpus=2, cohort="lab"), "b": Quota(gpus=4, jobs=1, cohort="lab")}
    running = [run("a1", "a", 3, started=10), run("b-own", "b", 1)]
    # b's job slot is taken by its own job, which a reclaim does not touch: halting a1 would gain nothing
    assert choose([wait("b1", "b", 2)], running, quotas, BIG, POLICY, NOW).decisions == []


def test_jobs_already_halting_for_a_waiter_are_counted_instead_of_preempting_more():
    running = [run("a-own", "a", 2), run("a1", "a", 2, leaving=True, preempted_for="b1", haltable=False),
               run("a2", "a", 2, started=10)]
    outcome = choose([wait("b1", "b", 2)], running, LAB, BIG, POLICY, NOW)
    assert outcome.decisions == [] and outcome.returning == {"b1": Usage(gpus=2, learners=1)}


def test_two_waiters_do_not_claim_the_same_victim():
    running = [run("a-own", "a", 2), run("a1", "a", 2, started=10), run("a2", "a", 2, started=20)]
    outcome = choose([wait("b1", "b", 2), wait("b2", "b", 2)], running, LAB, BIG, POLICY, NOW)
    assert victims(outcome) == [["a2"], ["a1"]]


def test_a_job_that_is_not_running_cannot_be_halted():
    running = [run("a-own", "a", 2), run("storing", "a", 2, started=10, haltable=False)]
    assert choose([wait("b1", "b", 2)], running, LAB, BIG, POLICY, NOW).decisions == []


def test_priority_never_takes_what_another_cohort_member_holds_within_its_own_quota():
    running = [run("b-own", "b", 4, started=10)]
    # a's urgent job would borrow b's quota: b is not borrowing, so nothing is halted for it
    assert choose([wait("urgent", "a", 4, priority=3)], running, LAB, BIG, POLICY, NOW).decisions == []
    running = [run("a-own", "a", 2, started=10), run("a-more", "a", 2, started=20)]  # a borrows 2 of b's
    outcome = choose([wait("urgent", "b", 4, priority=3)], running, LAB, BIG, POLICY, NOW)
    assert victims(outcome) == [["a-more"]]

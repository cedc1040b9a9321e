"""Borrowing inside a cohort: the arithmetic, the words a user reads, and how a pass uses it."""

import pytest

from trainforge_services.common.errors import InvalidArgument
from trainforge_services.trainer import admission, cohorts, quotas, storedocs
from trainforge_services.trainer.cohorts import Book
from trainforge_services.trainer.resources import BackendSize, Limits, Queued, Quota, TeamUse, Usage

GI = 2**30
BIG = BackendSize(Usage(gpus=16, cpus=64, memory=256 * GI, learners=32))


def job(job_id: str, team: str, *, gpus: int = 0, cpus: float = 0, priority: int = 1,
        created_at: float = 0.0) -> Queued:
    return Queued(job_id, team, Usage(gpus, cpus, 0, 1), priority, created_at)


def held(**gpus: int) -> dict[str, TeamUse]:
    return {team: TeamUse(Usage(gpus=n, learners=1), 1) for team, n in gpus.items()}


LAB = {"a": Quota(gpus=2, cohort="lab"), "b": Quota(gpus=4, cohort="lab")}


def test_a_team_borrows_what_the_others_of_its_cohort_leave_unused():
    reason, borrowed = Book(LAB, {}).fit(job("j", "a", gpus=5))
    assert reason is None and borrowed == Usage(gpus=3)
    # b holds 2 of its 4: a may borrow only the other 2
    reason, _ = Book(LAB, held(b=2)).fit(job("j", "a", gpus=5))
    assert reason == "needs 5 GPUs; team quota 2, in use 0, cohort lab has 2 to lend"
    assert Book(LAB, held(b=2)).fit(job("j", "a", gpus=4)) == (None, Usage(gpus=2))


def test_within_its_own_quota_a_job_borrows_nothing_and_outside_a_cohort_nothing_is_lent():
    assert Book(LAB, held(a=1)).fit(job("j", "a", gpus=1)) == (None, Usage())
    alone = {"a": Quota(gpus=2), "b": Quota(gpus=4)}
    assert Book(alone, {}).fit(job("j", "a", gpus=3))[0] == "needs 3 GPUs; team quota 2, in use 0"


def test_the_borrowing_limit_caps_what_a_team_takes_beyond_its_quota():
    lab = {**LAB, "a": Quota(gpus=2, cohort="lab", borrowing_limit=Limits(gpus=1))}
    assert Book(lab, {}).fit(job("j", "a", gpus=3)) == (None, Usage(gpus=1))
    assert Book(lab, {}).fit(job("j", "a", gpus=4))[0] == "needs 4 GPUs; team quota 2 + borrowing limit 1, in use 0"


def test_the_lending_limit_keeps_the_rest_of_a_quota_for_its_owner():
    lab = {**LAB, "b": Quota(gpus=4, cohort="lab", lending_limit=Limits(gpus=1))}
    assert Book(lab, {}).fit(job("j", "a", gpus=3)) == (None, Usage(gpus=1))
    assert Book(lab, {}).fit(job("j", "a", gpus=4))[0] == \
        "needs 4 GPUs; team quota 2, in use 0, cohort lab has 1 to lend"
    # b holding 3 of its own 4 leaves only 1 unused, however much it lends
    assert Book(lab, held(b=3)).fit(job("j", "a", gpus=3)) == (None, Usage(gpus=1))
    assert Book(lab, held(b=4)).fit(job("j", "a", gpus=3))[0] is not None


def test_an_owner_whose_quota_is_lent_out_waits_for_it_with_that_reason():
    book = Book(LAB, held(a=5))  # a borrows 3 of b's 4
    reason, _ = book.fit(job("j", "b", gpus=2))
    assert reason == "needs 2 GPUs; team quota 4, in use 0, 3 lent to cohort lab"
    assert book.within_nominal("b", Usage(gpus=2))
    assert book.borrowing("a") == Usage(gpus=3) and book.borrowing("b") == Usage()
    assert book.fit(job("j", "b", gpus=1)) == (None, Usage())


def test_resources_without_a_limit_are_neither_lent_nor_borrowed_and_jobs_stay_the_teams_own():
    lab = {"a": Quota(gpus=2, jobs=1, cohort="lab"), "b": Quota(cpus=8, cohort="lab")}
    assert Book(lab, {}).fit(job("j", "a", gpus=3))[0] == "needs 3 GPUs; team quota 2, in use 0, cohort lab has 0 to lend"
    assert Book(lab, {}).fit(job("j", "b", gpus=10)) == (None, Usage())
    assert Book(lab, held(a=1)).fit(job("j", "a", gpus=1))[0] == "needs a job slot; team quota 1 jobs, in use 1"


def test_ceilings_raise_a_quota_to_what_borrowing_could_ever_give():
    lab = {"a": Quota(gpus=2, cohort="lab", borrowing_limit=Limits(gpus=10)),
           "b": Quota(gpus=4, cohort="lab", lending_limit=Limits(gpus=3)), "c": Quota(gpus=1)}
    raised = cohorts.ceilings(lab)
    assert (raised["a"].gpus, raised["b"].gpus, raised["c"].gpus) == (5, 6, 1)


def test_a_pass_gives_jobs_that_need_not_borrow_their_turn_first_and_records_what_is_borrowed():
    queue = [job("a1", "a", gpus=3, created_at=1), job("b1", "b", gpus=4, created_at=2)]
    book = Book(LAB, {})
    plan = admission.plan(queue, Usage(), BIG, quotas=cohorts.ceilings(LAB), fit=book.fit)
    # a1 came first but would borrow b's quota, which b's own job needs
    assert plan.dispatch == ["b1"]
    assert plan.wait["a1"][0] == "needs 3 GPUs; team quota 2, in use 0, cohort lab has 0 to lend"
    plan = admission.plan(queue[:1], Usage(), BIG, quotas=cohorts.ceilings(LAB), fit=Book(LAB, {}).fit)
    assert plan.dispatch == ["a1"] and plan.borrowed == {"a1": Usage(gpus=1)}


def test_a_job_bigger_than_its_quota_but_within_reach_of_the_cohort_is_not_refused():
    plan = admission.plan([job("a1", "a", gpus=7)], Usage(), BIG, quotas=cohorts.ceilings(LAB),
                          fit=Book(LAB, {}).fit)
    assert plan.reject == {"a1": "needs 7 GPUs but team quota is 6"}
    plan = admission.plan([job("a1", "a", gpus=6)], Usage(), BIG, quotas=cohorts.ceilings(LAB),
                          fit=Book(LAB, {}).fit)
    assert plan.dispatch == ["a1"] and plan.borrowed["a1"] == Usage(gpus=4)


def test_a_preempted_job_is_first_of_its_priority_in_its_teams_queue():
    queue = [job("old", "a", created_at=1), Queued("back", "a", Usage(), 1, 5.0, front=True),
             job("urgent", "a", priority=2, created_at=9)]
    assert [q.job_id for q in admission.queue_order(queue)] == ["urgent", "back", "old"]


@pytest.mark.parametrize(("quota", "field", "words"), [
    (Quota(gpus=2, lending_limit=Limits(gpus=1)), "quota.lending_limit.gpus", "only applies in a cohort"),
    (Quota(gpus=2, cohort="Lab!"), "quota.cohort", "lowercase"),
    (Quota(gpus=2, cohort="lab", lending_limit=Limits(gpus=3)), "quota.lending_limit.gpus", "at most quota.gpus"),
    (Quota(gpus=2, cohort="lab", borrowing_limit=Limits(cpus=1)), "quota.borrowing_limit.cpus", "needs quota.cpus"),
    (Quota(gpus=2, cohort="lab", borrowing_limit=Limits(gpus=-1)), "quota.borrowing_limit.gpus", ">= 0"),
])
def test_bad_cohort_settings_are_refused_naming_the_field(quota, field, words):
    with pytest.raises(InvalidArgument) as e:
        quotas.validate("a", quota)
    assert [d["field"] for d in e.value.details] == [field]
    assert words in e.value.details[0]["message"]


def test_a_quota_with_a_cohort_survives_its_document():
    quota = Quota(gpus=2, cpus=4.5, cohort="lab", lending_limit=Limits(gpus=1), borrowing_limit=Limits(cpus=2))
    assert storedocs.quota_of(storedocs.quota_doc(quota)) == quota

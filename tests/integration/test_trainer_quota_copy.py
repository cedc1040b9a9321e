"""The Trainer's copy of the team quotas (services/trainer/quotas.py, `max_age`) against the real Mongo-wire
store, and the capacity a pass reuses while a newer one is asked for off its thread (capacity.py)."""

from __future__ import annotations

import threading

from tests.servers import wait_for
from trainforge_services.trainer.capacity import CapacityCache
from trainforge_services.trainer.quotas import QuotaStore
from trainforge_services.trainer.resources import BackendSize, Quota, Usage


def test_a_put_here_is_seen_at_once_and_one_made_elsewhere_within_max_age(mongo_db, unique):
    here = QuotaStore(mongo_db, f"quotas_{unique}", max_age=0.5)
    elsewhere = QuotaStore(mongo_db, f"quotas_{unique}")  # another replica
    here.put("a", Quota(gpus=4), "admin")
    assert here.get("a").gpus == 4 and here.get("b") == Quota()
    here.put("a", Quota(gpus=2), "admin")
    assert here.get("a").gpus == 2 and here.all()["a"].gpus == 2  # its own write: at once
    elsewhere.put("a", Quota(gpus=1), "admin")
    wait_for(lambda: here.get("a").gpus == 1, 5, "the other replica's quota")
    # the copy is not read again for every call
    calls = []
    original = here._all
    here._all = lambda: calls.append(1) or original()  # type: ignore[method-assign]
    for _ in range(50):
        here.all()
    assert len(calls) <= 1


def test_max_age_zero_reads_the_store_each_time(mongo_db, unique):
    plain = QuotaStore(mongo_db, f"quotas_{unique}")
    QuotaStore(mongo_db, f"quotas_{unique}").put("a", Quota(jobs=3), "admin")
    assert plain.get("a").jobs == 3


class SlowLcm:
    """Answers GetCapacity once `release` is set, counting the questions."""

    def __init__(self) -> None:
        self.asked = 0
        self.release = threading.Event()
        self.cpus = 4.0

    def get_capacity(self) -> BackendSize:
        self.asked += 1
        if self.asked > 1:
            assert self.release.wait(10)
        return BackendSize(total=Usage(cpus=self.cpus, learners=8), backend="slow")


def test_a_pass_reuses_the_capacity_while_a_newer_answer_is_asked_for_off_its_thread():
    lcm = SlowLcm()
    cache = CapacityCache(lcm, ttl=0.0)  # every answer is old at once
    threads: list[threading.Thread] = []

    def background(fn) -> None:  # noqa: ANN001
        threads.append(threading.Thread(target=fn))
        threads[-1].start()

    assert cache.current(background).total.cpus == 4  # unknown: asked in the pass
    lcm.cpus = 8.0
    # old: the pass gets the last answer at once while one question is in flight, however often it asks
    for _ in range(5):
        assert cache.current(background).total.cpus == 4
    assert len(threads) == 1
    lcm.release.set()
    threads[0].join(10)
    assert cache.value.total.cpus == 8 and lcm.asked == 2

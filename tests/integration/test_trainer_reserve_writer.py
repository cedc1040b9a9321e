"""A pass decides on the job copy and hands its reservations to the writer thread: what that must never lose.

The copy is read by the reader thread and the reservations are written by the
writer thread, each on its own time (services/trainer/dispatcher.py). Until a
reservation is written and read back, every later pass must count it as held
and not as queued, whatever a read that overlapped the write says; a write
that failed must not leave the job lost.
"""

from __future__ import annotations

import threading

import pytest

from tests.integration.test_trainer_dispatcher import GI, ScriptedLcm, queue
from tests.servers import wait_for
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.states import JobState
from trainforge_services.trainer.jobmirror import JobMirror
from trainforge_services.trainer.resources import BackendSize, Usage
from trainforge_services.trainer.stamps import STAMPS
from trainforge_services.trainer.store import JobStore
from trainforge_services.trainer.wiring import wire

FIELDS = ("team", "resources", "gpu_type", "priority", "created_at", "attempt", "cleanup_pending")


class GatedStore(JobStore):
    """A store whose moves into DEPLOYING wait until `release` is set (or fail while `fail` is set)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.release = threading.Event()
        self.release.set()
        self.waiting = threading.Event()
        self.fail = False

    def apply_transition(self, job_id, to, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if to == JobState.DEPLOYING:
            if self.fail:
                raise Unavailable("the store is restarting")
            self.waiting.set()
            assert self.release.wait(30)
        return super().apply_transition(job_id, to, *args, **kwargs)


@pytest.fixture
def gated(mongo_db, unique) -> GatedStore:
    store = GatedStore(mongo_db, collection=f"jobs_{unique}")
    store.ensure_indexes()
    return store


def four_cpus() -> ScriptedLcm:
    return ScriptedLcm(BackendSize(Usage(gpus=0, cpus=4, memory=8 * GI, learners=4)))


def test_a_reservation_not_yet_written_holds_its_room_for_the_next_passes(gated):
    lcm = four_cpus()
    core = wire(gated, lcm, interval=60)
    dispatcher = core.dispatcher
    for job_id in ("c", "d", "e"):
        queue(gated, job_id, cpus=2)
    gated.release.clear()
    writer = None
    try:  # pass by pass, as the reader, the pass and the writer threads would, with the writer held
        dispatcher._refresh()
        result, writes = dispatcher._run_pass()
        assert result.dispatch == ["c", "d"] and writes is not None
        writer = threading.Thread(target=dispatcher._writer.write, args=(writes,))
        writer.start()
        assert gated.waiting.wait(15)  # "c"'s write is under way, "d"'s not started
        # a read now still shows "c" and "d" QUEUED: the next pass must not take them, nor give "e" their room
        dispatcher._refresh()
        assert set(dispatcher._jobs.queued) == {"c", "d", "e"}
        result, more = dispatcher._run_pass()
        assert result.dispatch == [] and set(result.wait) == {"e"} and more is None
        assert dispatcher._jobs.pending == 2
        gated.release.set()
        assert writes.done.wait(15)
        assert [gated.find(j).state for j in ("c", "d", "e")] == [JobState.DEPLOYING, JobState.DEPLOYING,
                                                                  JobState.QUEUED]
        dispatcher._refresh()
        result, more = dispatcher._run_pass()
        assert result.dispatch == [] and set(result.wait) == {"e"} and more is None
        wait_for(lambda: sorted(lcm.deploys) == [("c", 1), ("d", 1)], 10, "the deploys of c and d")
    finally:
        gated.release.set()
        if writer is not None:
            writer.join(15)
        core.stop()


def test_a_read_that_began_before_the_write_returned_does_not_requeue_the_job(mongo_db, unique):
    store = JobStore(mongo_db, collection=f"jobs_{unique}")
    store.ensure_indexes()
    queue(store, "j", cpus=1)
    mirror = JobMirror(store, FIELDS, settled=STAMPS.settled, background=False)
    mirror.refresh()
    job = mirror.queued["j"]
    mirror.reserve("j", job.model_copy(update={"state": JobState.DEPLOYING}))
    assert "j" not in mirror.snapshot().queued and "j" in mirror.snapshot().active
    # a read stuck in the store while the write is made and returns: what it read is from before the write
    stale = store.changed_since(0.0, fields=FIELDS)
    done = store.apply_transition("j", JobState.DEPLOYING, "reserved", "trainer")
    mirror.written("j", done.job)
    with mirror._lock:
        for old in stale:
            mirror._put(old)  # what the stuck read applies, late
    copy = mirror.snapshot()
    assert "j" not in copy.queued and copy.active["j"].state == JobState.DEPLOYING
    mirror.refresh()  # began after the write returned: the reservation is read back, and no longer pending
    copy = mirror.snapshot()
    assert mirror.pending == 0 and not mirror._pending
    assert "j" not in copy.queued and copy.active["j"].state == JobState.DEPLOYING


def test_a_reservation_whose_write_failed_is_queued_again_after_the_next_read(gated):
    lcm = four_cpus()
    core = wire(gated, lcm, interval=60)
    dispatcher = core.dispatcher
    queue(gated, "j", cpus=2)
    queue(gated, "k", cpus=3)
    gated.fail = True
    try:
        result = dispatcher.run_once()  # the pass reserves "j"; its write fails
        assert result.dispatch == ["j"] and gated.find("j").state == JobState.QUEUED
        copy = dispatcher._jobs.snapshot()
        assert "j" in copy.active and "j" not in copy.queued  # counted as held until read back
        assert dispatcher._jobs.pending == 0
        gated.fail = False
        result = dispatcher.run_once()  # the read after the failure shows it QUEUED: it is reserved again
        assert result.dispatch == ["j"] and set(result.wait) == {"k"}
        assert gated.find("j").state == JobState.DEPLOYING
        wait_for(lambda: lcm.deploys == [("j", 1)], 10, "j deployed once")
    finally:
        core.stop()


def test_a_job_cancelled_between_its_reservation_and_the_write_is_not_deployed_and_frees_its_room(gated):
    lcm = four_cpus()
    core = wire(gated, lcm, interval=60)
    dispatcher = core.dispatcher
    queue(gated, "j", cpus=3)
    queue(gated, "k", cpus=3)
    gated.release.clear()
    try:
        dispatcher._refresh()
        result, writes = dispatcher._run_pass()
        assert result.dispatch == ["j"] and writes is not None
        writer = threading.Thread(target=dispatcher._writer.write, args=(writes,))
        writer.start()
        assert gated.waiting.wait(15)
        gated.transition("j", JobState.CANCELLED, "cancelled by the user", "alice")
        gated.release.set()
        writer.join(15)
        assert gated.find("j").state == JobState.CANCELLED
        result = dispatcher.run_once()
        assert result.dispatch == ["k"]
        wait_for(lambda: lcm.deploys == [("k", 1)], 10, "k deployed, j never")
    finally:
        gated.release.set()
        core.stop()

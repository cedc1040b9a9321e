"""The dispatcher's copy of the queue (services/trainer/jobmirror.py) against the real Mongo-wire store.

It must follow every change a pass decides on (submits, transitions, a
cleanup done) by reading only what changed, and fall back to a full read
when asked or when its copy is older than RESYNC.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.integration.test_trainer_store import MANIFEST, queued
from trainforge_services.common.states import JobState
from trainforge_services.trainer.fence import Deposed
from trainforge_services.trainer.jobmirror import JobMirror
from trainforge_services.trainer.stamps import STAMPS, Stamps
from trainforge_services.trainer.store import JobStore

FIELDS = ("team", "resources", "attempt", "reason", "cleanup_pending")


@pytest.fixture
def store(mongo_db, unique) -> JobStore:
    s = JobStore(mongo_db, collection=f"jobs_{unique}")
    s.ensure_indexes()
    return s


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_copy_follows_submits_transitions_and_cleanups(store):
    mirror = JobMirror(store, FIELDS, resync=3600)
    queued(store, "a")
    assert mirror.refresh() is None  # the first read is a full one
    assert set(mirror.queued) == {"a"} and mirror.as_queued["a"].team == "t"
    queued(store, "b")
    store.transition("a", JobState.DEPLOYING, "reserved", "trainer")
    changed = mirror.refresh()
    assert changed == {"a", "b"}  # only what changed was read
    assert set(mirror.queued) == {"b"} and set(mirror.active) == {"a"}
    store.transition("a", JobState.CANCELLED, "cancelled", "user")
    store.transition("b", JobState.CANCELLED, "cancelled", "user")
    mirror.refresh()
    assert not mirror.queued and not mirror.active and not mirror.as_queued
    assert store.find("a").cleanup_pending
    # "a" left ACTIVE but its learners are not removed yet: what it holds is still in use
    assert set(mirror.releasing) == {"a"} and mirror.releasing["a"].holds.cpus == 4
    assert set(JobMirror(store, FIELDS).releasing) == set()  # (not read yet)
    fresh = JobMirror(store, FIELDS, resync=3600)
    assert fresh.refresh() is None and set(fresh.releasing) == {"a"}  # a full read finds it too
    store.cleanup_done("a", 1)
    assert "a" in mirror.refresh()
    assert not mirror.releasing


def test_queue_notes_are_not_changes(store):
    mirror = JobMirror(store, FIELDS, margin=0, resync=3600)
    queued(store, "a")
    mirror.refresh()
    store.note_queued([("a", 1, "waiting for room", 3)])
    assert mirror.refresh() == set()


def test_a_pass_records_its_own_moves_at_once(store):
    mirror = JobMirror(store, FIELDS, resync=3600)
    queued(store, "a")
    queued(store, "b")
    mirror.refresh()
    done = store.apply_transition("a", JobState.DEPLOYING, "reserved", "trainer")
    mirror.moved("a", done.job)
    mirror.moved("b", None)  # a reservation that lost: not where the pass thought
    assert set(mirror.active) == {"a"} and not mirror.queued


@pytest.mark.parametrize("background", [False, True])
def test_a_stale_copy_is_read_again_whole(store, mongo_db, background):
    clock = Clock()
    mirror = JobMirror(store, FIELDS, resync=30, clock=clock, background=background)
    queued(store, "a")
    mirror.refresh()
    # a write the stamps cannot show (as from a writer whose clock is far behind): only a full read sees it
    store.insert("b", "t", MANIFEST)
    store.transition("b", JobState.QUEUED, "admitted", "trainer")
    mongo_db[store._jobs.name].update_one({"_id": "b"}, {"$set": {"changed_at": 0.0}})
    clock.now += 1
    mirror.refresh()
    assert set(mirror.queued) == {"a"}
    clock.now += 30
    if not background:
        assert mirror.refresh() is None and set(mirror.queued) == {"a", "b"}
        return
    # the full read runs off the pass: this pass reads what changed and starts it; a later one merges it
    assert "b" not in mirror.refresh() and mirror.reading and set(mirror.queued) == {"a"}
    assert mirror.wait_read(30)
    assert "b" in mirror.refresh() and not mirror.reading and set(mirror.queued) == {"a", "b"}
    clock.now += 1
    mirror.refresh()
    assert not mirror.reading  # the next is due 30 s after the last one started


def test_a_reservation_on_the_copy_takes_one_write_and_falls_back_when_it_is_stale(store):
    a, b = queued(store, "a"), queued(store, "b")
    done = store.apply_transition("a", JobState.DEPLOYING, "reserved", "trainer", attempt=1, seen=a)
    assert done.changed and done.job.state == JobState.DEPLOYING
    assert [(e.from_state, e.to_state) for e in done.job.history][-1] == (JobState.QUEUED, JobState.DEPLOYING)
    store.transition("b", JobState.CANCELLED, "cancelled", "user")
    # the copy still says QUEUED: its write matches nothing, and the full path sees the cancellation
    assert store.apply_transition("b", JobState.DEPLOYING, "reserved", "trainer", attempt=1, seen=b) == (None, False)


def test_a_reservation_on_a_copy_from_before_a_newer_leaders_stamp_is_refused(store):
    c = queued(store, "c")  # the copy: no stamp yet
    store.stamp_fence(7)
    with pytest.raises(Deposed):
        store.apply_transition("c", JobState.DEPLOYING, "reserved", "trainer", attempt=1, fence=5, seen=c)
    assert store.find("c").state == JobState.QUEUED
    done = store.apply_transition("c", JobState.DEPLOYING, "reserved", "trainer", attempt=1, fence=7, seen=c)
    assert done.changed and done.job.fence == 7


def test_a_late_commit_is_missed_by_the_short_reads_and_seen_by_the_next_wide_one(store, mongo_db):
    clock = Clock()
    clock.now = time.time()
    start = clock.now
    mirror = JobMirror(store, FIELDS, resync=3600, clock=clock, margin=5, short_margin=1, wide_every=2)
    queued(store, "a")
    assert mirror.refresh() is None
    clock.now += 0.5
    mirror.refresh()
    # committed now, stamped 3 s before the last read (a writer that waited long on a loaded store)
    queued(store, "b")
    mongo_db[store._jobs.name].update_one({"_id": "b"}, {"$set": {"changed_at": start - 3}})
    clock.now += 0.5
    assert "b" not in mirror.refresh() and set(mirror.queued) == {"a"}  # back 1 s only
    clock.now += 1.0
    assert "b" in mirror.refresh() and set(mirror.queued) == {"a", "b"}  # 2 s after the last wide read


def test_the_only_writer_reads_each_change_once(store, mongo_db):
    # without a leader election the Trainer is the only writer: reads go back to what was settled, not `margin`
    mirror = JobMirror(store, FIELDS, resync=3600, settled=STAMPS.settled)
    queued(store, "a")
    mongo_db[store._jobs.name].update_one({"_id": "a"}, {"$set": {"changed_at": time.time() - 3}})
    assert mirror.refresh() is None and set(mirror.queued) == {"a"}
    queued(store, "b")
    assert mirror.refresh() == {"b"}  # "a" (changed 3 s ago, before the last read) is not read again
    store.transition("b", JobState.DEPLOYING, "reserved", "trainer")
    assert mirror.refresh() == {"b"} and set(mirror.active) == {"b"}


def only_writer(store: JobStore) -> tuple[Clock, Stamps, JobMirror]:
    """The only Trainer's copy on a settable clock, after its first (full) read of one queued job "a"."""
    clock = Clock()
    clock.now = time.time()
    stamps = Stamps(clock)
    mirror = JobMirror(store, FIELDS, resync=3600, clock=clock, settled=stamps.settled)
    queued(store, "a")
    assert mirror.refresh() is None
    return clock, stamps, mirror


def test_the_only_writer_sees_a_write_that_was_out_across_a_read(store, mongo_db):
    clock, stamps, mirror = only_writer(store)
    with stamps.taken() as stamp:  # a write of this process the store has not answered yet
        clock.now += 3
        assert "late" not in mirror.refresh()  # read 3 s after its stamp, while it is out
        queued(store, "late")  # it commits after that read, stamped before it
        mongo_db[store._jobs.name].update_one({"_id": "late"}, {"$set": {"changed_at": stamp}})
    clock.now += 1
    assert "late" in mirror.refresh() and set(mirror.queued) == {"a", "late"}
    assert mirror.refresh() == set()  # and once only


def test_the_only_writer_reads_everything_again_when_the_clock_steps_back(store):
    clock, _, mirror = only_writer(store)
    clock.now += 1
    assert mirror.refresh() is not None
    clock.now -= 5  # stamps now come before the last read's
    assert mirror.refresh() is None and set(mirror.queued) == {"a"}


class HeldStore(JobStore):
    """The real store, whose background full read holds its pages (read) until `release` is set: what a pass
    does meanwhile happens after the read has passed every job."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.paged = threading.Event()
        self.release = threading.Event()

    def live_page(self, *args, **kwargs):
        page = super().live_page(*args, **kwargs)
        self.paged.set()
        assert self.release.wait(30), "the test never let the full read go on"
        return page


@pytest.fixture
def held(mongo_db, unique) -> HeldStore:
    s = HeldStore(mongo_db, collection=f"jobs_{unique}")
    s.ensure_indexes()
    return s


def fresh_copy(store: JobStore) -> dict[str, tuple[JobState, float, bool]]:
    """What a full read of the store right now puts in a copy: each job's state, stamp, cleanup flag."""
    mirror = JobMirror(store, FIELDS, resync=3600, background=False)
    assert mirror.refresh() is None
    return as_seen(mirror)


def as_seen(mirror: JobMirror) -> dict[str, tuple[JobState, float, bool]]:
    jobs = {**mirror.releasing, **mirror.active, **mirror.queued}
    assert set(mirror.as_queued) == set(mirror.queued)
    return {j.id: (j.state, j.changed_at, j.cleanup_pending) for j in jobs.values()}


class Ahead:
    """The wall clock, moved ahead by `by` seconds (the store's stamps are not)."""

    def __init__(self) -> None:
        self.by = 0.0

    def __call__(self) -> float:
        return time.time() + self.by


def held_copy(held: HeldStore) -> JobMirror:
    """The only Trainer's copy, on the store's own stamps (stamps.py), its clock settable ahead."""
    return JobMirror(held, FIELDS, resync=3600, settled=STAMPS.settled, clock=Ahead())


def aged(mongo_db, store: JobStore, seconds: float, *ids: str) -> None:
    """Stamp these jobs (all: none named) `seconds` back: changed well before any read the test makes."""
    match = {"_id": {"$in": list(ids)}} if ids else {}
    mongo_db[store._jobs.name].update_many(match, {"$set": {"changed_at": time.time() - seconds}})


def start_held_read(held: HeldStore, mirror: JobMirror) -> None:
    """Bring the copy's full read due and start it; wait until its pages are read (and held)."""
    mirror._clock.by += 3600
    mirror.refresh()
    assert mirror.reading and held.paged.wait(30)


def test_changes_made_while_the_full_read_runs_are_kept_and_nothing_left_is_brought_back(held, mongo_db):
    mirror = held_copy(held)
    for job_id in ("reserved", "cancelled", "waits", "failed"):
        queued(held, job_id)
    running = queued(held, "running")
    held.transition("running", JobState.DEPLOYING, "reserved", "trainer")
    assert mirror.refresh() is None and set(mirror.queued) == {"reserved", "cancelled", "waits", "failed"}
    start_held_read(held, mirror)
    # the pages hold every job as it was; now a pass reserves one and rejects one, a user cancels one, a
    # job ends (its learners not removed yet), and a new one is submitted
    done = held.apply_transition("reserved", JobState.DEPLOYING, "reserved", "trainer", attempt=1,
                                 seen=mirror.queued["reserved"])
    assert done.changed
    mirror.moved("reserved", done.job)
    held.transition("failed", JobState.FAILED, "never fits", "trainer")
    mirror.moved("failed", None)
    held.transition("cancelled", JobState.CANCELLED, "cancelled", "user")
    held.transition("running", JobState.CANCELLED, "cancelled", "user")
    queued(held, "new")
    assert {"cancelled", "running", "new"} <= mirror.refresh() and mirror.reading
    held.release.set()
    assert mirror.wait_read(30)
    mirror.refresh()  # the merge
    assert not mirror.reading
    assert set(mirror.queued) == {"waits", "new"}
    assert set(mirror.active) == {"reserved"} and mirror.active["reserved"].state == JobState.DEPLOYING
    assert set(mirror.releasing) == {"running"}  # ended, and still counted until KillJob removed it
    assert running.id not in mirror.active
    assert as_seen(mirror) == fresh_copy(held)


def test_the_merge_mends_what_the_reads_of_what_changed_missed(held, mongo_db):
    """Writes stamped far back (another writer's clock behind) are missed by the reads of what changed;
    the merged full read ends with the copy a fresh full read makes."""
    mirror = held_copy(held)
    queued(held, "a")
    queued(held, "gone")
    aged(mongo_db, held, 60)
    assert mirror.refresh() is None
    queued(held, "missed")
    held.transition("gone", JobState.CANCELLED, "cancelled", "user")
    aged(mongo_db, held, 30, "missed", "gone")
    assert not {"missed", "gone"} & mirror.refresh() and set(mirror.queued) == {"a", "gone"}  # both missed
    held.release.set()
    start_held_read(held, mirror)
    assert mirror.wait_read(30)
    assert {"missed", "gone"} <= mirror.refresh()
    assert set(mirror.queued) == {"a", "missed"}
    assert as_seen(mirror) == fresh_copy(held)


def test_a_job_deleted_while_the_full_read_runs_is_gone_after_the_next_one(held, mongo_db):
    """A deletion is no change the copy can read (no stamp): the merge keeps the entry it has, and the
    next full read, which does not find the job, drops it."""
    mirror = held_copy(held)
    queued(held, "a")
    queued(held, "deleted")
    aged(mongo_db, held, 60)
    assert mirror.refresh() is None
    start_held_read(held, mirror)
    mongo_db[held._jobs.name].delete_one({"_id": "deleted"})
    held.release.set()
    assert mirror.wait_read(30)
    mirror.refresh()
    assert set(mirror.queued) == {"a", "deleted"}
    start_held_read(held, mirror)  # the next full read (its pages no longer held)
    assert mirror.wait_read(30)
    mirror.refresh()
    assert set(mirror.queued) == {"a"} and as_seen(mirror) == fresh_copy(held)


def test_a_full_read_asked_for_drops_the_one_under_way(held):
    mirror = held_copy(held)
    queued(held, "a")
    assert mirror.refresh() is None
    start_held_read(held, mirror)
    assert mirror.refresh(full=True) is None and not mirror.reading  # taking the lead: read now, whole
    held.release.set()
    mirror.close()
    assert not mirror.reading and set(mirror.queued) == {"a"}


def test_the_full_read_pages_through_jobs_that_share_a_stamp(store, mongo_db):
    """A new leader stamps every queued job at once: pages in `changed_at` order still read them all."""
    mirror = JobMirror(store, FIELDS, resync=3600, settled=STAMPS.settled, clock=Ahead(), page=4)
    for i in range(7):
        queued(store, f"early{i}")
        aged(mongo_db, store, 90 + i, f"early{i}")  # one stamp each: pages that move on by stamp
    for i in range(10):
        queued(store, f"same{i}")
    aged(mongo_db, store, 60, *(f"same{i}" for i in range(10)))
    for i in range(5):
        queued(store, f"late{i}")
    aged(mongo_db, store, 30, *(f"late{i}" for i in range(5)))
    want = fresh_copy(store)
    assert len(want) == 22
    assert mirror.refresh() is None  # the first read is a full one (synchronous): empty the copy to see the merge
    mirror.queued, mirror.as_queued = {}, {}
    mirror._clock.by += 3600
    mirror.refresh()
    assert mirror.wait_read(30)
    assert len(mirror.refresh()) == 22 and as_seen(mirror) == want

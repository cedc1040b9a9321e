"""The dispatcher with a plain-Python LCM: reservations, refusals and stubborn cleanups."""

from __future__ import annotations

import threading
import time

import pytest

from tests.servers import wait_for
from trainforge_services.common.errors import ResourceExhausted, Unavailable
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.common.states import JobState
from trainforge_services.trainer.resources import BackendSize, Usage
from trainforge_services.trainer.store import JobStore
from trainforge_services.trainer.wiring import wire

GI = 2**30


class ScriptedLcm:
    """An `Lcm` whose KillJob fails a given number of times first."""

    def __init__(self, capacity: BackendSize, kill_failures: int = 0, deploy_failures: int = 0,
                 deploy_error: type[Exception] = Unavailable):
        self.capacity = capacity
        self.deploy_error = deploy_error
        self.kill_failures = kill_failures
        self.deploy_failures = deploy_failures
        self.deploy_tries = 0
        self.deploys: list[tuple[str, int]] = []
        self.kill_tries: list[str] = []
        self.kill_attempts: list[tuple[str, int]] = []  # every KillJob: (job, the attempt it names)
        self.halts: list[tuple[str, int]] = []
        self.gated: set[tuple[str, int]] = set()  # attempts deployed with `gated`
        self.gates: list[tuple[str, int]] = []  # every OpenGate that succeeded
        self.gate_error = False  # OpenGate fails (Unavailable) while set
        self.gate_tries = 0
        self.checkpoint_uris: dict[tuple[str, int], str] = {}
        self.synced: list[tuple[str, object]] = []  # every SyncTeam: (team, quota)
        self._lock = threading.Lock()

    def deploy_job(self, job_id, team, attempt, manifest_json, code_uri, checkpoint_uri="", gated=False,  # noqa: ANN001
                   reads=()):
        with self._lock:
            if gated:
                self.gated.add((job_id, attempt))
            self.deploy_tries += 1
            if self.deploy_tries <= self.deploy_failures:
                raise self.deploy_error("connection refused: the LCM is restarting"
                                        if self.deploy_error is Unavailable else
                                        "needs 1 learner(s); the local backend runs at most 4 and 4 are running")
            self.deploys.append((job_id, attempt))
            self.checkpoint_uris[(job_id, attempt)] = checkpoint_uri
        return [f"pid:{job_id}"]

    def halt_job(self, job_id, attempt):  # noqa: ANN001
        with self._lock:
            self.halts.append((job_id, attempt))

    def open_gate(self, job_id, attempt):  # noqa: ANN001
        with self._lock:
            self.gate_tries += 1
            if self.gate_error:
                raise Unavailable("the LCM is restarting")
            self.gates.append((job_id, attempt))

    def kill_job(self, job_id, reason="", attempt=0):  # noqa: ANN001
        with self._lock:
            self.kill_tries.append(job_id)
            self.kill_attempts.append((job_id, attempt))
            if len(self.kill_tries) <= self.kill_failures:
                raise Unavailable("LCM restarting")
        return 1

    def grow_job(self, job_id, attempt, learners):  # noqa: ANN001
        return True

    def get_capacity(self) -> BackendSize:
        return self.capacity

    def sync_team(self, team, quota):  # noqa: ANN001
        with self._lock:
            self.synced.append((team, quota))
        return True


@pytest.fixture
def store(mongo_db, unique) -> JobStore:
    return JobStore(mongo_db, collection=f"jobs_{unique}")


def queue(store: JobStore, job_id: str, *, cpus: float, priority: str = "normal") -> None:
    manifest = parse_manifest({"name": job_id, "command": "x", "priority": priority,
                               "resources": {"cpus": cpus, "memory": "1Gi"}})
    store.insert(job_id, "t", manifest)
    store.transition(job_id, JobState.QUEUED, "admitted", "trainer")


def test_a_pass_reserves_what_fits_and_words_the_rest(store):
    lcm = ScriptedLcm(BackendSize(Usage(gpus=0, cpus=4, memory=8 * GI, learners=4)))
    core = wire(store, lcm)
    dispatcher = core.dispatcher
    queue(store, "big", cpus=3)
    queue(store, "urgent", cpus=2, priority="high")
    queue(store, "small", cpus=2)
    queue(store, "never", cpus=5)
    try:
        result = dispatcher.run_once()
        assert result.dispatch == ["urgent", "small"]
        wait_for(lambda: sorted(lcm.deploys) == [("small", 1), ("urgent", 1)], 10, "both deploys")
        big = store.find("big")
        assert (big.state, big.reason, big.queue_position) == \
            (JobState.QUEUED, "needs 3 CPUs; capacity 4, in use 4", 1)
        never = store.find("never")
        assert (never.state, never.reason) == (JobState.FAILED, "needs 5 CPUs but the backend has 4")
        assert store.find("urgent").history[-1].actor == "trainer"
        # a second pass changes nothing: the reservations hold the room
        assert dispatcher.run_once().dispatch == []
    finally:
        core.stop()


def running(store: JobStore, job_id: str) -> None:
    queue(store, job_id, cpus=1)
    for to in (JobState.DEPLOYING, JobState.RUNNING):
        store.transition(job_id, to, "test", "trainer")


def test_killjob_is_retried_until_the_lcm_answers(store):
    lcm = ScriptedLcm(BackendSize(Usage(cpus=4, memory=8 * GI, learners=4)), kill_failures=2)
    core = wire(store, lcm, kill_backoff=0.01)
    running(store, "j")
    assert store.transition("j", JobState.CANCELLED, "cancelled", "user").cleanup_pending
    try:
        core.calls.clean_up("j")
        wait_for(lambda: not store.find("j").cleanup_pending, 10, "the cleanup to be recorded")
    finally:
        core.stop()
    assert lcm.kill_tries == ["j", "j", "j"]


def test_a_cleanup_that_ran_out_of_tries_is_picked_up_by_a_later_pass(store):
    lcm = ScriptedLcm(BackendSize(Usage(cpus=4, memory=8 * GI, learners=4)), kill_failures=3)
    core = wire(store, lcm, kill_attempts=2, kill_backoff=0.01)
    dispatcher = core.dispatcher
    running(store, "j")
    store.transition("j", JobState.FAILED, "learner 0 exited with code 1", "monitor")
    try:
        core.calls.clean_up("j")
        wait_for(lambda: len(lcm.kill_tries) == 2, 10, "the first two KillJobs")
        assert store.find("j").cleanup_pending
        # the scan of pending cleanups (once a second, after the retry backoff) tries again
        wait_for(lambda: (dispatcher.run_once(), not store.find("j").cleanup_pending)[1], 15,
                 "a pass to finish the cleanup", interval=0.2)
    finally:
        core.stop()
    assert len(lcm.kill_tries) == 4


def test_an_ended_job_holds_its_learners_until_killjob_removed_them(store):
    """The LCM counts a finished job's learners until its KillJob ran; the pass counts them too, so it never
    dispatches into a slot the LCM would refuse (that deploy would wait out a retry backoff)."""
    lcm = ScriptedLcm(BackendSize(Usage(cpus=4, memory=8 * GI, learners=1)), kill_failures=1000)
    core = wire(store, lcm, kill_attempts=1, kill_backoff=0.01)
    dispatcher = core.dispatcher
    running(store, "old")
    store.transition("old", JobState.STORING, "storing outputs", "monitor")
    assert store.transition("old", JobState.COMPLETED, "all learners completed", "monitor").cleanup_pending
    queue(store, "next", cpus=1)
    try:
        assert dispatcher.run_once().dispatch == []  # KillJob of "old" fails: its learner may still run
        assert store.find("next").state == JobState.QUEUED
        store.cleanup_done("old", 1)  # what a KillJob that answered records
        assert dispatcher.run_once().dispatch == ["next"]
        wait_for(lambda: lcm.deploys == [("next", 1)], 10, "the deploy")
    finally:
        core.stop()
    assert lcm.deploy_tries == 1  # never refused


def test_capacity_is_asked_for_at_start_and_never_by_a_caller(store):
    answer = threading.Event()

    class SlowLcm(ScriptedLcm):
        asked = 0

        def get_capacity(self) -> BackendSize:
            self.asked += 1
            answer.wait(10)
            return self.capacity

    lcm = SlowLcm(BackendSize(Usage(cpus=4, memory=8 * GI, learners=4)))
    core = wire(store, lcm, interval=60)
    dispatcher = core.dispatcher
    try:
        assert dispatcher.capacity() is None and lcm.asked == 0  # unknown, and a caller does not wait for it
        started = time.monotonic()
        dispatcher.start(capacity_wait=0.1)
        assert time.monotonic() - started < 5  # a slow LCM delays the start by capacity_wait at most
        assert dispatcher.capacity() is None and lcm.asked == 1
        answer.set()
        wait_for(lambda: dispatcher.capacity() == lcm.capacity, 10, "the capacity asked for at start")
    finally:
        answer.set()
        core.stop()


def test_an_admins_view_of_the_capacity_has_it_asked_again_off_its_thread_when_older_than_the_ttl(store):
    """The admin's cluster view shows what the LCM says now (its NetworkPolicy canary's verdict changes after
    start), though no pass runs while nothing is queued: an old answer is returned and a new one asked for."""
    lcm = ScriptedLcm(BackendSize(Usage(cpus=4, memory=8 * GI, learners=4), "kubernetes", "unknown (first run)"))
    core = wire(store, lcm, interval=60)
    dispatcher = core.dispatcher
    try:
        assert dispatcher.capacity() is None  # no pass has run, and the Trainer was not started
        dispatcher.capacity_viewed()  # returns what is known and has the LCM asked off its thread
        wait_for(lambda: dispatcher.capacity() == lcm.capacity, 10, "the capacity a view asked for")
        lcm.capacity = BackendSize(lcm.capacity.total, "kubernetes", "NOT enforced")
        assert dispatcher.capacity().network_policy == "unknown (first run)"  # no pass asks while none is queued
        wait_for(lambda: dispatcher.capacity_viewed().network_policy == "NOT enforced", 10,
                 "the view's answer asked for again")
    finally:
        core.stop()


def test_a_deploy_that_waits_says_why_in_the_jobs_reason(store):
    """An LCM that answers Unavailable (restarting, or its docker engine unreachable: test_docker_backend.py): the
    job stays DEPLOYING and its reason says why, then says it was deployed once the LCM answers."""
    lcm = ScriptedLcm(BackendSize(Usage(cpus=4, memory=8 * GI, learners=4)), deploy_failures=10**6)
    core = wire(store, lcm, kill_backoff=0.01)
    dispatcher = core.dispatcher
    queue(store, "j", cpus=1)
    try:
        dispatcher.run_once()
        waiting = wait_for(lambda: "restarting" in (j := store.find("j")).reason and j, 10, "the waiting reason")
        assert waiting.state == JobState.DEPLOYING
        assert waiting.reason.startswith("waiting to deploy (LCM unavailable): connection refused: the LCM is "
                                         "restarting; trying again in "), waiting.reason
        with lcm._lock:
            lcm.deploy_failures = 0
        wait_for(lambda: lcm.deploys == [("j", 1)], 10, "the deploy to get through")
        wait_for(lambda: store.find("j").reason.startswith("deployed after "), 10, "the reason to say it deployed")
    finally:
        core.stop()
    assert store.find("j").state == JobState.DEPLOYING


def test_a_job_cancelled_before_its_deploy_reached_the_lcm_has_that_attempt_killed(store):
    """The KillJob names the attempt whose deploy is still on its way, so the LCM marks it killed although it
    holds nothing of the job yet (services/lcm/lifecycle/core.py refuses that deploy when it arrives)."""
    lcm = ScriptedLcm(BackendSize(Usage(cpus=4, memory=8 * GI, learners=4)), deploy_failures=10**6)
    core = wire(store, lcm, kill_backoff=0.01)
    dispatcher = core.dispatcher
    queue(store, "j", cpus=1)
    try:
        dispatcher.run_once()
        wait_for(lambda: "restarting" in store.find("j").reason, 10, "the deploy to wait")
        assert store.find("j").attempt == 1
        assert store.transition("j", JobState.CANCELLED, "cancelled by user:k1", "user").cleanup_pending
        core.calls.clean_up("j")
        wait_for(lambda: not store.find("j").cleanup_pending, 10, "the cleanup to be recorded")
        assert lcm.kill_attempts == [("j", 1)]
    finally:
        core.stop()
    assert lcm.deploys == [] and store.find("j").state == JobState.CANCELLED


@pytest.mark.parametrize("error", [Unavailable, ResourceExhausted], ids=["restarting", "still-removing-ended"])
def test_a_deploy_waits_out_an_lcm_that_refuses_for_now(store, error):
    """An LCM restarting, or one that still counts learners of ended jobs until their KillJob (full): the
    deploy is tried again, not failed."""
    lcm = ScriptedLcm(BackendSize(Usage(cpus=4, memory=8 * GI, learners=4)), deploy_failures=3, deploy_error=error)
    core = wire(store, lcm, kill_backoff=0.01)
    dispatcher = core.dispatcher
    queue(store, "j", cpus=1)
    try:
        dispatcher.run_once()
        wait_for(lambda: lcm.deploys == [("j", 1)], 10, "the deploy to get through")
    finally:
        core.stop()
    assert lcm.deploy_tries == 4
    assert store.find("j").state == JobState.DEPLOYING


def test_passes_go_on_while_the_full_read_runs_and_its_merge_keeps_their_reservations(mongo_db, unique):
    from tests.integration.test_trainer_jobmirror import HeldStore

    held = HeldStore(mongo_db, collection=f"jobs_{unique}")
    held.ensure_indexes()
    lcm = ScriptedLcm(BackendSize(Usage(gpus=0, cpus=4, memory=8 * GI, learners=4)))
    core = wire(held, lcm)
    dispatcher = core.dispatcher
    for job_id in ("a", "b", "c"):
        queue(held, job_id, cpus=2)
    try:
        assert dispatcher.run_once().dispatch == ["a", "b"]  # the first pass reads everything, before it
        dispatcher._jobs._full_at = float("-inf")  # the periodic full read is due (30 s later)
        assert dispatcher.run_once().dispatch == []  # starts it
        assert held.paged.wait(30) and dispatcher._jobs.reading
        # its pages are read and held: passes go on meanwhile, from what changed
        queue(held, "d", cpus=2)
        started = time.monotonic()
        result = dispatcher.run_once()
        assert result.dispatch == [] and set(result.wait) == {"c", "d"}
        assert time.monotonic() - started < 20 and dispatcher._jobs.reading  # it did not wait for the read
        held.release.set()
        assert dispatcher._jobs.wait_read(30)
        result = dispatcher.run_once()  # merges it: "a" and "b" still hold the room
        assert not dispatcher._jobs.reading and result.dispatch == [] and set(result.wait) == {"c", "d"}
        wait_for(lambda: sorted(lcm.deploys) == [("a", 1), ("b", 1)], 10, "the two deploys")
    finally:
        held.release.set()
        core.stop()

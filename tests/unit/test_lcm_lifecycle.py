"""The LCM's lifecycle against the in-memory backend and coordinator: every decision, no processes, no etcd.

The supervisor thread is parked (a one-hour interval); each test runs
`supervise_once` itself, so what a pass does is checked deterministically.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tests.fakes.backend import FakeBackend
from tests.fakes.coordinator import MemoryCoordinator
from trainforge_services.common.contracts.etcd import AttemptInfo, GateOpen, HaltRequest, LearnerStatus
from trainforge_services.common.errors import Conflict, InvalidArgument, ResourceExhausted, TrainforgeError
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.states import LearnerState
from trainforge_services.lcm.backends.base import Role, Site
from trainforge_services.lcm.lifecycle import JobDeployment, LifecycleManager, build_plan


def deployment(job_id: str = "j-1", attempt: int = 1, learners: int = 2, gpus: int = 0, **kw) -> JobDeployment:
    manifest = Manifest(name="mnist-ddp", learners=learners, command="python train.py",
                        resources={"gpus": gpus, "cpus": 1, "memory": "1Gi"})
    return JobDeployment(job_id=job_id, team="team-a", attempt=attempt, manifest=manifest, **kw)


@pytest.fixture
def coord() -> MemoryCoordinator:
    return MemoryCoordinator("/tf")


@pytest.fixture
def backend(tmp_path) -> FakeBackend:
    return FakeBackend(tmp_path / "work", gpus=4, max_learners=5)


@pytest.fixture
def lifecycles(backend, coord, tmp_path):
    made: list[LifecycleManager] = []

    def make() -> LifecycleManager:
        # one state dir for all: a second one made is the same LCM after a restart
        lc = LifecycleManager(backend, coord, tmp_path / "state", lease_ttl=7, start_timeout=45,
                              supervise_interval=3600)
        made.append(lc)
        return lc

    yield make
    for lc in made:
        lc.close()


@pytest.fixture
def lcm(lifecycles) -> LifecycleManager:
    return lifecycles()


def record_path(tmp_path: Path, job: str) -> Path:
    return tmp_path / "state" / "lcm" / "jobs" / f"{job}.json"


# -- the plan -------------------------------------------------------------------------


def test_the_plan_gives_each_rank_its_spec_gpus_and_the_shared_rendezvous(tmp_path):
    job = deployment(learners=3, gpus=2, code_uri="store://jobs/j-1/code.tar.gz", checkpoint_uri="store://c/1")
    site = Site(attempt_dir=tmp_path / "j-1" / "1", master_addr="10.1.2.3", master_port=29600)
    plan = build_plan(job, site, [1, 2, 4, 5, 6, 7], lease_ttl=9, start_timeout=12.5)

    assert plan.gpu_ids == ((1, 2), (4, 5), (6, 7))
    assert [s.rank for s in plan.learners] == [0, 1, 2]
    for spec in plan.learners:
        assert (spec.job_id, spec.team, spec.attempt, spec.world_size) == ("j-1", "team-a", 1, 3)
        assert (spec.master_addr, spec.master_port, spec.lease_ttl) == ("10.1.2.3", 29600, 9)
        assert spec.workdir == site.attempt_dir / f"learner-{spec.rank}"
        assert spec.gpu_ids == list(plan.gpu_ids[spec.rank])
        assert (spec.code_uri, spec.checkpoint_uri) == ("store://jobs/j-1/code.tar.gz", "store://c/1")
        assert spec.manifest == job.manifest
    assert (plan.monitor.learners, plan.monitor.attempt, plan.monitor.start_timeout) == (3, 1, 12.5)
    assert plan.expected() == {"monitor", "controller-0", "controller-1", "controller-2"}
    with pytest.raises(Exception, match="frozen"):
        plan.attempt = 2  # type: ignore[misc]


def test_deploy_plans_from_free_gpus_records_the_plan_and_writes_the_attempt_key(lcm, backend, coord, tmp_path):
    handles = lcm.deploy(deployment(learners=2, gpus=1, checkpoint_uri="store://c/7"))
    assert [h.name for h in handles] == ["monitor", "controller-0", "controller-1"]
    assert [h.role for h in handles] == [Role.MONITOR, Role.CONTROLLER, Role.CONTROLLER]
    assert str(handles[1]) == f"controller-0:{handles[1].ref}"
    plan = backend.launched[0]
    assert plan.gpu_ids == ((0,), (1,))
    assert (plan.master_addr, plan.master_port) == ("10.0.0.7", 29555)
    assert plan.learners[0].lease_ttl == 7 and plan.monitor.start_timeout == 45
    assert AttemptInfo.parse(coord.get(coord.keys.attempt("j-1"))[0]) == AttemptInfo(
        attempt=1, learners=2, checkpoint_uri="store://c/7")
    assert json.loads(record_path(tmp_path, "j-1").read_text())["plan"]["gpu_ids"] == [[0], [1]]


# -- idempotency and replacement ----------------------------------------------------------


def test_a_resent_deploy_starts_nothing_and_returns_the_same_handles(lcm, backend):
    first = lcm.deploy(deployment())
    assert lcm.deploy(deployment()) == first
    assert len(backend.launched) == 1 and backend.stopped == []
    [job] = lcm.running_jobs()
    assert (job.job_id, job.attempt, job.learners, job.handles) == ("j-1", 1, 2, first)


def test_an_older_attempt_conflicts(lcm):
    lcm.deploy(deployment(attempt=3))
    with pytest.raises(Conflict, match="attempt 2 is older than the deployed attempt 3"):
        lcm.deploy(deployment(attempt=2))


def test_a_newer_attempt_replaces_the_old_one_and_clears_its_etcd_keys(lcm, backend, coord):
    lcm.deploy(deployment(attempt=1))
    lcm.halt("j-1", 1)
    coord.put(coord.keys.learner_status("j-1", 0), {"state": int(LearnerState.LEARNER_HALTED), "attempt": 1})
    coord.put(coord.keys.attempt("other"), {"attempt": 1, "learners": 1})
    new = lcm.deploy(deployment(attempt=2, checkpoint_uri="store://c/1"))
    assert backend.stopped == ["j-1"]
    assert [p.attempt for p in backend.launched] == [1, 2]
    assert set(coord.list(coord.keys.job("j-1"))[0]) == {coord.keys.attempt("j-1")}
    assert coord.get(coord.keys.attempt("j-1"))[0]["attempt"] == 2
    assert coord.get(coord.keys.attempt("other"))[0] is not None, "another job's keys went too"
    assert lcm.view("j-1").handles == new


def test_an_attempt_whose_monitor_delivered_its_end_is_over_a_resent_deploy_starts_nothing(lcm, backend):
    first = lcm.deploy(deployment())
    backend.die("j-1")
    backend.finish_monitor("j-1")
    # a dispatcher's deploy resent after the attempt ended (it read the job as DEPLOYING just before)
    assert lcm.deploy(deployment()) == first
    assert len(backend.launched) == 1 and backend.stopped == [] and backend.monitor_restarts == []
    lcm.supervise_once()
    assert backend.monitor_restarts == []
    # the job's next attempt still replaces it, and KillJob removes it
    lcm.deploy(deployment(attempt=2))
    assert [p.attempt for p in backend.launched] == [1, 2] and backend.stopped == ["j-1"]


def test_a_resent_deploy_of_a_dead_attempt_only_starts_its_monitor_again(lcm, backend):
    first = lcm.deploy(deployment(learners=1))
    backend.die("j-1")
    again = lcm.deploy(deployment(learners=1))
    assert len(backend.launched) == 1 and backend.monitor_restarts == ["j-1"]
    assert [h.name for h in again] == ["controller-0", "monitor"]
    assert again[0] == first[1] and again[1] != first[0]


def test_a_launch_cut_short_is_redone_when_asked_again(lcm, backend):
    lcm.deploy(deployment(learners=2))
    backend.forget_process("j-1", "controller-1")
    again = lcm.deploy(deployment(learners=2))
    assert len(backend.launched) == 2 and backend.stopped == ["j-1"]
    assert sorted(h.name for h in again) == ["controller-0", "controller-1", "monitor"]


def test_a_failed_launch_stops_what_started_and_leaves_no_record(lcm, backend, tmp_path):
    backend.fail_launch = True
    with pytest.raises(TrainforgeError, match="cannot start the controller"):
        lcm.deploy(deployment())
    assert backend.stopped == ["j-1"] and "j-1" not in backend.jobs
    assert not record_path(tmp_path, "j-1").exists() and lcm.running_jobs() == []


# -- kill and halt --------------------------------------------------------------------------


def test_kill_stops_the_job_clears_its_keys_and_record_and_is_idempotent(lcm, backend, coord, tmp_path):
    lcm.deploy(deployment())
    lcm.deploy(deployment("j-2", learners=1))
    backend.die("j-1", "controller-1")
    coord.put(coord.keys.learner_status("j-1", 0), {"state": 2, "attempt": 1})
    assert lcm.kill("j-1") == 2
    assert coord.list(coord.keys.job("j-1"))[0] == {}
    assert not record_path(tmp_path, "j-1").exists()
    assert [j.job_id for j in lcm.running_jobs()] == ["j-2"]
    assert lcm.kill("j-1") == 0
    assert lcm.kill("never") == 0
    with pytest.raises(InvalidArgument, match="job_id"):
        lcm.kill("Bad.Id")


def test_a_killed_attempt_resent_late_starts_nothing_and_a_later_attempt_deploys(lcm, backend, coord):
    lcm.deploy(deployment(attempt=2))
    lcm.kill("j-1")
    assert coord.get(coord.keys.killed("j-1"))[0]["attempt"] == 2
    assert coord.leases[coord.keys.killed("j-1")].ttl == 3600
    # the dispatcher's deploy of attempt 2, in flight through the job's end and its KillJob
    with pytest.raises(Conflict, match="job j-1 attempt 2 was killed; a new run needs attempt 3"):
        lcm.deploy(deployment(attempt=2))
    with pytest.raises(Conflict, match=r"attempt 2 was killed; a new run needs attempt 3 \(asked: attempt 1\)"):
        lcm.deploy(deployment(attempt=1))
    assert [p.attempt for p in backend.launched] == [2] and lcm.view("j-1") is None
    assert coord.get(coord.keys.attempt("j-1"))[0] is None, "a refused deploy wrote the attempt key"
    lcm.deploy(deployment(attempt=3))
    assert [p.attempt for p in backend.launched] == [2, 3]
    assert coord.get(coord.keys.attempt("j-1"))[0]["attempt"] == 3
    assert coord.get(coord.keys.killed("j-1"))[0]["attempt"] == 2, "the deploy touched the mark"


def test_the_killed_mark_never_goes_down_and_a_repeated_kill_keeps_it(lifecycles, backend, coord, tmp_path):
    lcm = lifecycles()
    lcm.deploy(deployment(attempt=1))
    lcm.deploy(deployment(attempt=2))  # replaces attempt 1: marked too, harmlessly
    assert coord.get(coord.keys.killed("j-1"))[0]["attempt"] == 1
    lcm.kill("j-1")
    lcm.kill("j-1")
    assert coord.get(coord.keys.killed("j-1"))[0]["attempt"] == 2
    # a KillJob without a record (its state directory lost) takes the attempt from the job's etcd key
    lcm.deploy(deployment("j-2", attempt=4))
    (tmp_path / "state" / "lcm" / "jobs" / "j-2.json").unlink()
    lcm.close()
    again = lifecycles()
    backend.jobs.pop("j-2", None)  # nothing of it runs any more either
    again.kill("j-2")
    assert coord.get(coord.keys.killed("j-2"))[0]["attempt"] == 4
    with pytest.raises(Conflict, match="attempt 4 was killed"):
        again.deploy(deployment("j-2", attempt=4))


def test_a_kill_naming_an_attempt_marks_it_before_its_deploy_arrives(lcm, backend, coord):
    # cancelled while its deploy was still on the way: the LCM holds nothing of the job yet
    assert lcm.kill("j-1", attempt=3) == 0
    assert coord.get(coord.keys.killed("j-1"))[0]["attempt"] == 3
    with pytest.raises(Conflict, match="job j-1 attempt 3 was killed; a new run needs attempt 4"):
        lcm.deploy(deployment(attempt=3))
    assert backend.launched == [] and coord.get(coord.keys.attempt("j-1"))[0] is None
    # a kill naming no attempt (or a lower one) keeps the mark; the next attempt deploys
    lcm.kill("j-1")
    lcm.kill("j-1", attempt=2)
    assert coord.get(coord.keys.killed("j-1"))[0]["attempt"] == 3
    lcm.deploy(deployment(attempt=4))
    assert [p.attempt for p in backend.launched] == [4]
    # the mark is the highest of the named attempt, the record's and the etcd attempt key's
    lcm.kill("j-1", attempt=1)
    assert coord.get(coord.keys.killed("j-1"))[0]["attempt"] == 4
    coord.put(coord.keys.attempt("j-2"), AttemptInfo(attempt=6, learners=1).value())
    lcm.kill("j-2", attempt=5)
    assert coord.get(coord.keys.killed("j-2"))[0]["attempt"] == 6
    with pytest.raises(InvalidArgument, match="attempt must be 1 or more"):
        lcm.kill("j-3", attempt=-1)
    assert coord.get(coord.keys.killed("j-3"))[0] is None


def test_the_killed_marks_share_a_lease_for_a_tenth_of_its_ttl(lcm, coord):
    for job in ("a", "b"):
        lcm.deploy(deployment(job, learners=1))
        lcm.kill(job)
    lease, taken = lcm._marks._lease  # noqa: SLF001 - a tenth of the hour passes
    lcm._marks._lease = (lease, taken - 361)  # noqa: SLF001
    lcm.deploy(deployment("c", learners=1))
    lcm.kill("c")
    a, b, c = (coord.leases[coord.keys.killed(job)] for job in "abc")
    assert a == b and c != a and c.ttl == 3600


def test_a_launch_cut_short_and_redone_is_not_marked_killed(lifecycles, backend, coord):
    lcm = lifecycles()
    lcm.deploy(deployment(learners=2))
    backend.forget_process("j-1", "controller-1")
    lcm.deploy(deployment(learners=2))
    assert coord.get(coord.keys.killed("j-1"))[0] is None
    assert len(lcm.deploy(deployment(learners=2))) == 3 and len(backend.launched) == 2


def test_a_kill_cut_short_is_finished_and_marked_by_the_next_lcm(lifecycles, backend, coord, tmp_path):
    first = lifecycles()
    first.deploy(deployment(learners=1))
    first.deploy(deployment("redo", learners=1))
    first.mark_killing("j-1")  # the LCM died after stopping it, before it cleared the job's keys
    backend.die("j-1")
    # and while it cleared "redo"'s launch cut short to launch the same attempt again
    record = json.loads(record_path(tmp_path, "redo").read_text())
    record_path(tmp_path, "redo").write_text(json.dumps({**record, "killing": True, "redoing": True}))
    backend.die("redo")
    first.close()
    second = lifecycles()
    assert not record_path(tmp_path, "j-1").exists() and not record_path(tmp_path, "redo").exists()
    assert coord.get(coord.keys.killed("j-1"))[0]["attempt"] == 1
    assert coord.get(coord.keys.attempt("j-1"))[0] is None
    with pytest.raises(Conflict, match="attempt 1 was killed"):
        second.deploy(deployment(learners=1))
    assert coord.get(coord.keys.killed("redo"))[0] is None
    second.deploy(deployment("redo", learners=1))
    assert [p.job_id for p in backend.launched] == ["j-1", "redo", "redo"]


def test_halt_writes_the_halt_request_for_the_attempt(lcm, coord):
    lcm.halt("j-1", 3)
    halt = HaltRequest.parse(coord.get(coord.keys.halt("j-1"))[0])
    assert halt.attempt == 3 and halt.requested_at > 0
    with pytest.raises(InvalidArgument, match="attempt must be 1 or more"):
        lcm.halt("j-1", 0)


def test_a_gated_deploy_marks_every_learner_spec_and_open_gate_writes_the_gate_once(lcm, coord, backend):
    lcm.deploy(deployment(gated=True))
    plan = lcm._records.get("j-1").plan  # noqa: SLF001 - what the backend was handed
    assert plan.gated and all(spec.gated for spec in plan.learners)
    assert json.loads(plan.learners[0].to_json())["gated"] is True
    assert "gated" not in json.loads(build_plan(deployment(), Site(attempt_dir=Path("/w/j-1/1"), master_addr="a",
                                                                       master_port=1), [], lease_ttl=5,
                                                    start_timeout=5).learners[0].to_json())
    lcm.open_gate("j-1", 1)
    first = GateOpen.parse(coord.get(coord.keys.gate("j-1"))[0])
    lcm.open_gate("j-1", 1)  # repeated: the key is created once, its value unchanged
    assert GateOpen.parse(coord.get(coord.keys.gate("j-1"))[0]) == first and first.attempt == 1
    with pytest.raises(InvalidArgument, match="attempt must be 1 or more"):
        lcm.open_gate("j-1", 0)
    lcm.kill("j-1")  # the job's keys go with it
    assert coord.get(coord.keys.gate("j-1"))[0] is None


# -- supervision ------------------------------------------------------------------------------


def status(coord: MemoryCoordinator, rank: int) -> LearnerStatus | None:
    return LearnerStatus.parse_or_none(coord.get(coord.keys.learner_status("j-1", rank))[0])


def test_a_lost_controller_is_reported_failed_once_and_a_final_status_stands(lcm, backend, coord, tmp_path):
    lcm.deploy(deployment(learners=3))
    completed = LearnerStatus(state=LearnerState.LEARNER_COMPLETED, attempt=1, exit_code=0)
    coord.put(coord.keys.learner_status("j-1", 1), completed.value())
    backend.die("j-1", "controller-0", "controller-1")
    lcm.supervise_once()

    failed = status(coord, 0)
    assert (failed.state, failed.attempt, failed.exit_code) == (LearnerState.LEARNER_FAILED, 1, None)
    assert failed.message == (f"its controller ({backend.handle('j-1', 'controller-0')}) ended without "
                              "reporting the learner")
    assert status(coord, 1) == completed
    assert status(coord, 2) is None, "a live controller was reported"
    assert json.loads(record_path(tmp_path, "j-1").read_text())["reported_dead"] == [0, 1]
    coord.delete(coord.keys.learner_status("j-1", 0))
    lcm.supervise_once()
    assert status(coord, 0) is None, "a reported controller was reported again"


def test_a_lost_controllers_leased_status_is_left_to_expire_first(lcm, backend, coord):
    lcm.deploy(deployment(learners=1))
    coord.put(coord.keys.learner_status("j-1", 0), {"state": int(LearnerState.LEARNER_RUNNING), "attempt": 1})
    backend.die("j-1", "controller-0")
    lcm.supervise_once()
    assert status(coord, 0).state == LearnerState.LEARNER_RUNNING
    coord.delete(coord.keys.learner_status("j-1", 0))  # its lease ran out
    lcm.supervise_once()
    assert status(coord, 0).state == LearnerState.LEARNER_FAILED


def test_a_dead_monitor_is_restarted_only_while_it_has_not_delivered(lcm, backend):
    lcm.deploy(deployment(learners=1))
    lcm.supervise_once()
    assert backend.monitor_restarts == []
    backend.die("j-1", "monitor")
    lcm.supervise_once()
    assert backend.monitor_restarts == ["j-1"]
    lcm.supervise_once()
    assert backend.monitor_restarts == ["j-1"], "a running monitor was started again"
    backend.finish_monitor("j-1")
    lcm.supervise_once()
    assert backend.monitor_restarts == ["j-1"], "a monitor that delivered was started again"


def test_restarts_of_a_monitor_that_keeps_dying_are_spaced(lcm, backend):
    lcm.deploy(deployment(learners=1))
    backend.die("j-1", "monitor")
    lcm.supervise_once()
    backend.die("j-1", "monitor")
    lcm.supervise_once()
    assert backend.monitor_restarts == ["j-1"]


# -- an LCM restart ------------------------------------------------------------------------------


def test_a_restarted_lcm_adopts_what_runs_never_ended_or_ended_and_forgets_the_rest(lifecycles, backend, tmp_path):
    first = lifecycles()
    live = first.deploy(deployment("live"))
    done = first.deploy(deployment("done", learners=1))
    for job in ("unwatched", "killing"):
        first.deploy(deployment(job, learners=1))
    first.mark_killing("killing")
    backend.die("done")
    backend.finish_monitor("done")
    backend.die("unwatched")
    backend.die("killing")
    first.close()

    second = lifecycles()
    assert [(j.job_id, j.handles) for j in second.running_jobs()] == [("live", live)]
    assert not record_path(tmp_path, "killing").exists()
    assert backend.stopped == ["killing"]
    # one that ended while no LCM watched (e.g. during a leader change) is kept until its KillJob
    assert record_path(tmp_path, "unwatched").exists() and record_path(tmp_path, "done").exists()
    second.supervise_once()
    assert backend.monitor_restarts == ["unwatched"]
    assert second.deploy(deployment("live")) == live
    assert [h.name for h in second.deploy(deployment("unwatched", learners=1))] == ["controller-0", "monitor"]
    assert second.deploy(deployment("done", learners=1)) == done, "an ended attempt was answered afresh"
    assert len(backend.launched) == 4, "an adopted attempt was launched again"
    assert second.kill("done") == 0 and not record_path(tmp_path, "done").exists()


# -- capacity ------------------------------------------------------------------------------------


def test_gpus_and_learners_are_checked_against_what_other_attempts_hold(lcm, backend):
    lcm.deploy(deployment("a", learners=2, gpus=1))
    with pytest.raises(ResourceExhausted, match=r"^needs 4 GPU\(s\); the fake backend has 2 of 4 free$"):
        lcm.deploy(deployment("b", learners=2, gpus=2))
    lcm.deploy(deployment("b", learners=1, gpus=2))
    assert backend.launched[-1].gpu_ids == ((2, 3),)
    with pytest.raises(ResourceExhausted, match="^needs 3 learner\\(s\\); the fake backend runs at most 5 and 3 "
                                                "are running$"):
        lcm.deploy(deployment("c", learners=3))
    backend.die("a")  # a dead attempt holds nothing
    lcm.deploy(deployment("c", learners=2, gpus=1))
    assert backend.launched[-1].gpu_ids == ((0,), (1,))
    assert lcm.capacity() == backend.capacity()


def test_an_attempt_being_launched_holds_its_share(lcm, backend):
    started, release = threading.Event(), threading.Event()
    launch = backend.launch

    def slow_launch(plan):
        started.set()
        release.wait(10)
        return launch(plan)

    backend.launch = slow_launch
    first = threading.Thread(target=lcm.deploy, args=(deployment("a", learners=1, gpus=3),))
    first.start()
    try:
        assert started.wait(10)
        backend.launch = launch
        with pytest.raises(ResourceExhausted, match=r"needs 2 GPU\(s\); the fake backend has 1 of 4 free"):
            lcm.deploy(deployment("b", learners=1, gpus=2))
    finally:
        release.set()
        first.join(10)
    assert [j.job_id for j in lcm.running_jobs()] == ["a"]


def test_an_unreadable_record_is_skipped_on_restart(lifecycles, backend, tmp_path):
    lifecycles().deploy(deployment("good", learners=1))
    record_path(tmp_path, "bad").write_text("{not json")
    assert [j.job_id for j in lifecycles().running_jobs()] == ["good"]


def test_the_deploy_request_carries_gated_into_the_deployment():
    from trainforge_protos import lcm_pb2
    from trainforge_services.lcm.lifecycle.plan import deployment_from_request

    manifest = Manifest(name="t", command="python t.py").model_dump_json()
    request = lcm_pb2.DeployJobRequest(job_id="j-1", team="team-a", attempt=1, manifest_json=manifest, gated=True)
    assert deployment_from_request(request).gated
    request.gated = False
    assert not deployment_from_request(request).gated

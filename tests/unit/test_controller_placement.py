"""CPU placement: the learner on its share, the controller's output threads on the CPUs left over."""

from __future__ import annotations

import os

import pytest

from tests.servers import wait_for
from trainforge_services.common.settings import ControllerSettings
from trainforge_services.controller.learner import LearnerProcess
from trainforge_services.controller.logship import LogArchive
from trainforge_services.controller.priority import plan_placement, set_output_cpus
from trainforge_services.controller.spool import SpooledStream


def test_plan_gives_the_learner_its_share_and_the_output_threads_the_rest():
    p = plan_placement(1, {0, 1})
    assert (p.learner, p.output) == ({1}, {0})
    p = plan_placement(2.5, {0, 2, 4, 6, 8})  # rounded up; a cpuset need not be contiguous
    assert (p.learner, p.output) == ({4, 6, 8}, {0, 2})
    assert plan_placement(0.25, {3, 5}).learner == {5}


@pytest.mark.parametrize("cpus", [2, 3, 1.5, 64])
def test_a_job_that_asked_for_every_cpu_is_not_placed(cpus):
    assert plan_placement(cpus, {0, 1}) is None
    assert plan_placement(1, {7}) is None


def test_placement_moves_the_output_threads_by_default_and_can_be_turned_off(monkeypatch):
    assert ControllerSettings().place_cpus == "output"
    for value in ("off", "all"):
        monkeypatch.setenv("TF_PLACE_CPUS", value)
        assert ControllerSettings().place_cpus == value
    monkeypatch.setenv("TF_PLACE_CPUS", "learner")
    with pytest.raises(ValueError, match="place_cpus"):
        ControllerSettings()


def _two_cpus() -> tuple[int, int]:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.fail(f"placement needs 2 CPUs to test, this process may use {allowed}")
    return allowed[0], allowed[-1]


def test_output_threads_move_to_the_output_cpus_and_back(tmp_path):
    first, last = _two_cpus()
    own = os.sched_getaffinity(0)
    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    r, w = os.pipe()
    stream = SpooledStream("stdout", r, archive, tmp_path / "a.jsonl.stdout.spool", max_line=100).start()
    try:
        # threads already running are placed when the plan is set, and the controller's own thread is not
        set_output_cpus(frozenset({first}))
        for t in (stream._reader, stream._splitter):
            wait_for(lambda t=t: os.sched_getaffinity(t.native_id) == {first}, 5, f"{t.name} on CPU {first}")
        assert os.sched_getaffinity(0) == own
        os.write(w, b"one\ntwo\n")
    finally:
        set_output_cpus(None)
        os.close(w)
        assert stream.join(10)
        archive.close()
    assert archive.lines_written == 2


def test_the_learner_starts_on_its_cpus_and_the_controller_thread_keeps_its_own(tmp_path):
    first, last = _two_cpus()
    own = os.sched_getaffinity(0)
    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    # the command itself (below the guard and the shell) reports its affinity
    learner = LearnerProcess("grep Cpus_allowed_list /proc/self/status", tmp_path, {"PATH": "/usr/bin:/bin"},
                             archive, cpus=frozenset({last}))
    learner.start()
    assert os.sched_getaffinity(0) == own
    assert learner.wait(10) == 0
    assert learner.finish_output(10)
    archive.close()
    assert archive.lines_written == 1
    line = (tmp_path / "a.jsonl").read_text()
    assert f"Cpus_allowed_list:\\t{last}\"" in line, line

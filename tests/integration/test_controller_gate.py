"""A gated learner (a prestarted trial) as a real controller process against real etcd: it prepares, starts
the learner's process (the guard, or the sandbox's entry with the whole sandbox) held just before the user's
command - or, for a bare `python ...` command, the command too, its interpreter held in the learners' start-up
hook before the user's program (services/controller/pyhold.py) - says it is held, and starts the program only
once the job's `gate` key is written; a halt, a cancel or the controller's death while held ends it with
nothing of the user's run and nothing left running. A gate key whose watch keeps failing fails the attempt
with that reason."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from tests.integration.test_controller_halt import halt
from tests.integration.test_controller_run import ListSink, Run, controller_log, launch, pack, status  # noqa: F401
from tests.servers import blocked_on_a_pipe, wait_for
from trainforge_services.common.contracts.etcd import GateOpen
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.settings import ControllerSettings
from trainforge_services.common.states import LearnerState
from trainforge_services.controller.controller import Controller
from trainforge_services.controller.gate import HELD, GateWatchFailed, wait_for_gate

LEARNER = '''
import pathlib, time
pathlib.Path("started").write_text(repr(time.time()))
print("learner started", flush=True)
'''


# How each kind of hold is asked for: a bare interpreter holds itself; anything more is held by the process.
COMMANDS = {"interpreter": "python learner.py", "process": "cd . && python learner.py"}
HOLD_FLAGS = {"--hold", "--pass-hold"}


def start(launch, hold: str = "interpreter", **kw):  # noqa: ANN001, ANN201, F811
    return launch({"command": COMMANDS[hold]}, code=pack({"learner.py": LEARNER}), gated=True, **kw)


def is_held(coordinator, run) -> bool:  # noqa: ANN001
    doc = status(coordinator, run)
    return doc is not None and doc["state"] == LearnerState.LEARNER_PREPARING and doc["message"] == HELD


def marker(run):  # noqa: ANN001, ANN201
    return run.spec_path.parent / f"learner-{run.rank}" / "started"


def descendants(run) -> list[psutil.Process]:  # noqa: ANN001
    try:
        return [p for p in psutil.Process(run.proc.pid).children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


def held_process(run, hold: str = "interpreter") -> psutil.Process | None:  # noqa: ANN001
    """The held process, None while there is none: the controller's child started with --hold (the guard or
    the sandbox's entry); for a hold in the interpreter, that interpreter once it waits on its hold pipe."""
    for p in descendants(run):
        try:
            argv = p.cmdline()
            if hold == "process" and HOLD_FLAGS & set(argv):
                return p
            if hold == "interpreter" and argv[-1:] == ["learner.py"] and "python" in argv[0]:
                return p if blocked_on_a_pipe(p.pid) else None
        except psutil.Error:
            continue
    return None


def user_code_running(run, hold: str) -> bool:  # noqa: ANN001
    """Whether the shell or the user's program runs (the held process names the command in its own argv); for
    a hold in the interpreter, the shell and the interpreter are there by design: whether the interpreter
    went past its hold."""
    if hold == "interpreter":
        return held_process(run, hold) is None
    for p in descendants(run):
        try:
            argv = p.cmdline()
            if "learner.py" in " ".join(argv) and not HOLD_FLAGS & set(argv):
                return True
        except psutil.Error:
            continue
    return False


HOLDS = pytest.mark.parametrize(("isolation", "hold"), [
    ("none", "interpreter"), ("auto", "interpreter"), ("none", "process"), ("auto", "process")])


@HOLDS
def test_a_gated_learner_waits_held_until_the_gate_opens(launch, coordinator, isolation, hold):  # noqa: F811
    run = start(launch, hold, isolation=isolation)
    wait_for(lambda: is_held(coordinator, run) and held_process(run, hold), 60,
             "the controller to say it is held, its learner's process started and held")
    # held: the learner's process is there, the user's program has not started, and stays so while no gate is
    # written (watched for a second)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert not marker(run).exists() and is_held(coordinator, run), controller_log(run)
        assert held_process(run, hold) is not None and not user_code_running(run, hold)
        time.sleep(0.1)
    how = "in its interpreter" if hold == "interpreter" else "before its command"
    assert f", {how}): {COMMANDS[hold]}" in controller_log(run)
    opened = time.time()
    coordinator.put(coordinator.keys.gate(run.job), GateOpen(attempt=1).value())
    assert run.wait(60) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, controller_log(run)
    assert doc["tail"] == ["learner started"], doc
    assert float(marker(run).read_text()) >= opened
    assert doc["isolation"] == "none" if isolation == "none" else doc["isolation"] in ("sandbox", "none")


@HOLDS
def test_a_cancel_while_held_ends_it_without_running_anything(launch, coordinator, isolation, hold):  # noqa: F811
    run = start(launch, hold, isolation=isolation)
    held = wait_for(lambda: is_held(coordinator, run) and held_process(run, hold), 60, "the learner's process held")
    group = [held, *held.children(recursive=True), *descendants(run)]
    run.proc.send_signal(signal.SIGTERM)  # what a cancel does to the controller
    assert run.wait(60) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED, doc
    assert doc["message"] == "the controller received SIGTERM (learner not started)", doc
    assert not marker(run).exists()
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in group), 10,
             "the held process to be gone")


@HOLDS
def test_the_controller_killed_while_held_leaves_nothing_running(launch, coordinator, isolation, hold):  # noqa: F811
    run = start(launch, hold, isolation=isolation)
    held = wait_for(lambda: is_held(coordinator, run) and held_process(run, hold), 60, "the learner's process held")
    group = [held, *held.children(recursive=True), *descendants(run)]
    run.proc.kill()
    run.proc.wait(10)
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in group), 10,
             "the held process to die with its controller")
    coordinator.put(coordinator.keys.gate(run.job), GateOpen(attempt=1).value())  # too late: nobody to start
    deadline = time.monotonic() + 0.5  # a started command would write its marker at once: watch for it
    while time.monotonic() < deadline:
        assert not marker(run).exists()
        time.sleep(0.05)


def waiting_on_its_hold(run) -> psutil.Process | None:  # noqa: ANN001
    """The held process once nothing but its hold is left before the command, else None: the guard asleep
    with its lifeline thread started (the step before the hold), or the sandbox's pid 1 asleep and dropped
    to the learner's uid (its step before the hold)."""
    held = [p for p in descendants(run) if "--hold" in p.cmdline()]  # the guard, or the entry and its pid 1
    try:
        last = held[-1]
        asleep = last.status() == psutil.STATUS_SLEEPING
        if len(held) == 1:
            return last if asleep and last.num_threads() == 2 and not last.children() else None
        return last if asleep and last.uids().real != 0 else None
    except (IndexError, psutil.Error):
        return None


@HOLDS
def test_a_sigterm_before_the_command_starts_is_kept_and_the_command_never_starts(
        launch, coordinator, isolation, hold):  # noqa: F811
    # A stop that reaches the learner's group while its command does not exist yet (the interpreter starting,
    # the sandbox being built, or held as here) must not be lost: caught and forgotten by the guard or the
    # sandbox's entry, the command started anyway, ran and was SIGKILLed after the grace period. Held in its
    # interpreter, the held interpreter itself dies of it before the user's program.
    run = start(launch, hold, isolation=isolation)
    held = wait_for(lambda: is_held(coordinator, run)
                    and (waiting_on_its_hold(run) if hold == "process" else held_process(run, hold)), 60,
                    "the learner's process to wait on its hold")
    os.killpg(os.getpgid(held.pid), signal.SIGTERM)
    coordinator.put(coordinator.keys.gate(run.job), GateOpen(attempt=1).value())
    assert run.wait(60) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_FAILED, doc
    if hold == "process":
        assert doc["exit_code"] == 128 + signal.SIGTERM, doc
        assert doc["message"] == "learner was killed by SIGTERM (exit code 143)", doc
    else:  # the held interpreter died of it at once: seen before the gate opened, or as the release's outcome
        assert doc["message"] in ("learner was killed by SIGTERM (exit code 143)", "learner exited with code 143",
                                  "the held learner process ended before its command started "
                                  "(learner was killed by SIGTERM (exit code 143))",
                                  "the held learner process ended before its command started "
                                  "(learner exited with code 143)"), doc
    assert not marker(run).exists() and doc["tail"] == []
    assert doc["isolation"] == "none" if isolation == "none" else doc["isolation"] in ("sandbox", "none")


def test_a_gate_opened_before_the_controller_started_lets_it_start_at_once(launch, coordinator, unique):  # noqa: F811
    job = f"early-{unique}"
    coordinator.put(coordinator.keys.gate(job), GateOpen(attempt=1).value())
    run = start(launch, job=job)
    assert run.wait(60) == 0, controller_log(run)
    assert status(coordinator, run)["state"] == LearnerState.LEARNER_COMPLETED
    assert marker(run).exists()


def test_a_halt_while_held_ends_halted_without_starting_the_learner(launch, coordinator):  # noqa: F811
    run = start(launch)
    wait_for(lambda: is_held(coordinator, run), 60, "the controller to say it is held")
    halt(coordinator, run)
    assert run.wait(60) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_HALTED and "before the learner started" in doc["message"], doc
    assert not marker(run).exists()


def broken_for(coordinator, key: str, failures: int | None):  # noqa: ANN001, ANN201
    """The real coordinator's watch_prefix, failing for `key` the first `failures` times (None: always)."""
    real = coordinator.watch_prefix
    calls = [0]

    def watch_prefix(prefix, *args, **kw):  # noqa: ANN001, ANN202
        if prefix == key:
            calls[0] += 1
            if failures is None or calls[0] <= failures:
                raise RuntimeError(f"watch stream broke ({calls[0]})")
        return real(prefix, *args, **kw)

    return watch_prefix, calls


def test_a_failed_gate_watch_is_started_again_and_still_sees_the_gate(coordinator, unique, monkeypatch):
    job = f"rewatch-{unique}"
    watch, calls = broken_for(coordinator, coordinator.keys.gate(job), 2)
    monkeypatch.setattr(coordinator, "watch_prefix", watch)
    coordinator.put(coordinator.keys.gate(job), GateOpen(attempt=1).value())
    assert wait_for_gate(coordinator, job, lambda: False, retry_pause=0.05) is True
    assert calls[0] == 3


def test_a_gate_watch_that_keeps_failing_raises_with_why(coordinator, unique, monkeypatch):
    job = f"nowatch-{unique}"
    watch, calls = broken_for(coordinator, coordinator.keys.gate(job), None)
    monkeypatch.setattr(coordinator, "watch_prefix", watch)
    with pytest.raises(GateWatchFailed, match=r"watching the job's gate failed 3 times "
                                              r"\(last: RuntimeError: watch stream broke \(3\)\)"):
        wait_for_gate(coordinator, job, lambda: False, retries=2, retry_pause=0.05)
    assert calls[0] == 3


def test_a_held_learner_whose_gate_cannot_be_watched_fails_the_attempt(coordinator, store_settings, tmp_path,
                                                                      unique, monkeypatch):
    job = f"gatefail-{unique}"
    watch, _ = broken_for(coordinator, coordinator.keys.gate(job), None)
    monkeypatch.setattr(coordinator, "watch_prefix", watch)
    monkeypatch.setattr("trainforge_services.controller.gate.WATCH_RETRY_PAUSE", 0.05)
    workdir = tmp_path / "attempt" / "learner-0"
    spec = LearnerSpec.model_validate({
        "job_id": job, "attempt": 1, "rank": 0, "world_size": 1, "gated": True,
        "manifest": {"name": "t", "command": "touch ran"}, "code_uri": "",
        "workdir": str(workdir), "lease_ttl": 4})
    controller = Controller(spec, ControllerSettings(**store_settings.model_dump(), isolation="none"),
                            coordinator=coordinator, sink=ListSink())
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(controller.run()), daemon=True)
    thread.start()
    thread.join(60)
    assert result == [0], "the controller did not end on its own"
    doc = status(coordinator, Run(None, job, 0, 1, tmp_path))
    assert doc["state"] == LearnerState.LEARNER_FAILED, doc
    assert doc["message"].startswith("watching the job's gate failed 4 times (last: RuntimeError: watch stream "
                                     "broke (4)) (learner not started)"), doc
    assert not (workdir / "ran").exists()

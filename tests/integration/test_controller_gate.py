"""A gated learner (a prestarted trial) as a real controller process against real etcd: it prepares, says it is
held, and starts its learner only once the job's `gate` key is written; a halt while held ends it HALTED."""

from __future__ import annotations

import time

from tests.integration.test_controller_halt import halt
from tests.integration.test_controller_run import controller_log, launch, pack, status  # noqa: F401
from tests.servers import wait_for
from trainforge_services.common.contracts.etcd import GateOpen
from trainforge_services.common.states import LearnerState
from trainforge_services.controller.gate import HELD

LEARNER = '''
import pathlib, time
pathlib.Path("started").write_text(repr(time.time()))
print("learner started", flush=True)
'''


def start(launch, **kw):  # noqa: ANN001, ANN201, F811
    return launch({"command": "python learner.py"}, code=pack({"learner.py": LEARNER}), gated=True, **kw)


def is_held(coordinator, run) -> bool:  # noqa: ANN001
    doc = status(coordinator, run)
    return doc is not None and doc["state"] == LearnerState.LEARNER_PREPARING and doc["message"] == HELD


def marker(run):  # noqa: ANN001, ANN201
    return run.spec_path.parent / f"learner-{run.rank}" / "started"


def test_a_gated_learner_waits_held_until_the_gate_opens(launch, coordinator):  # noqa: F811
    run = start(launch)
    wait_for(lambda: is_held(coordinator, run), 60, "the controller to say it is held")
    # held: the learner has not started, and stays so while no gate is written (watched for a second)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert not marker(run).exists() and is_held(coordinator, run), controller_log(run)
        time.sleep(0.1)
    opened = time.time()
    coordinator.put(coordinator.keys.gate(run.job), GateOpen(attempt=1).value())
    assert run.wait(60) == 0, controller_log(run)
    assert status(coordinator, run)["state"] == LearnerState.LEARNER_COMPLETED, controller_log(run)
    assert float(marker(run).read_text()) >= opened


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

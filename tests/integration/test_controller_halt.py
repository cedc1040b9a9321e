"""Halting and checkpoints in the controller, as a real process against real etcd and a local object store.

The learner here is a small script that counts steps and keeps a checkpoint
the way frameworks/torch/helper.py does (checkpoint.json removed, the
checkpoint file replaced, then checkpoint.json naming its step), without
torch, so each test takes seconds.
"""

from __future__ import annotations

import json
import signal
import time

import psutil

from tests.integration.test_controller_run import controller_log, launch, pack, status, watch_states  # noqa: F401
from tests.servers import wait_for
from trainforge_services.common.adapters.objectstore import store_from_settings
from trainforge_services.common.contracts.etcd import CheckpointStored, Halted, LearnerStatus
from trainforge_services.common.states import LearnerState

LEARNER = '''
import json, os, pathlib, signal, sys, time
d = pathlib.Path(os.environ["TF_CHECKPOINT_DIR"])
halt = False
def on_term(*_):
    global halt
    halt = True
signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("IGNORE_TERM") else on_term)

def save(step):
    (d / "checkpoint.json").unlink(missing_ok=True)
    for name, data in (("model.bin", f"weights at {step}"), ("checkpoint.json", json.dumps({"step": step}))):
        tmp = d / f".{name}.tmp"
        tmp.write_text(data)
        os.replace(tmp, d / name)

meta = d / "checkpoint.json"
step = json.loads(meta.read_text())["step"] if meta.exists() else 0
print(f"start {step}", flush=True)
while True:
    step += 1
    if halt:
        save(step)
        print(f"halted at {step}", flush=True)
        sys.exit(0)
    if step % 10 == 0:
        save(step)
    time.sleep(0.02)
'''


def start(launch, env: dict | None = None, **kw):  # noqa: F811
    return launch({"command": "python learner.py", "env": env or {}}, code=pack({"learner.py": LEARNER}), **kw)


def checkpoint_key(coordinator, run) -> dict | None:
    return coordinator.get(coordinator.keys.learner_checkpoint(run.job, run.rank))[0]


def halt(coordinator, run, attempt: int | None = None) -> None:
    coordinator.put(coordinator.keys.halt(run.job), {"attempt": attempt or run.attempt, "requested_at": time.time()})


def test_a_halt_stores_the_newest_checkpoint_and_ends_halted(launch, coordinator, store_settings):  # noqa: F811
    run = start(launch)
    first = wait_for(lambda: checkpoint_key(coordinator, run), 30, "a periodic checkpoint upload")
    assert first["attempt"] == 1 and first["step"] % 10 == 0
    assert first["uri"] == f"store://jobs/{run.job}/checkpoints/0/{first['step']:012d}/"
    halt(coordinator, run)
    assert run.wait(30) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_HALTED, doc
    step = doc["step"]
    assert step > first["step"]  # the checkpoint saved on the halt signal
    assert doc["checkpoint_uri"] == f"store://jobs/{run.job}/checkpoints/0/{step:012d}/"
    assert "halted (stopped after SIGTERM); checkpoint at step" in doc["message"]
    halted = coordinator.get(coordinator.keys.learner_halted(run.job, 0))[0]
    assert halted == {"attempt": 1, "step": step, "checkpoint_uri": doc["checkpoint_uri"]}
    store = store_from_settings(store_settings)
    prefix = f"jobs/{run.job}/checkpoints/0/{step:012d}/"
    assert store.get_bytes(prefix + "model.bin") == f"weights at {step}".encode()
    assert json.loads(store.get_bytes(prefix + "checkpoint.json")) == {"step": step}
    # only the newest 3 copies are kept
    steps = {i.key.split("/")[4] for i in store.list(f"jobs/{run.job}/checkpoints/0/")}
    assert len(steps) <= 3 and f"{step:012d}" in steps


def test_a_learner_ignoring_the_halt_signal_is_killed_and_keeps_its_last_periodic_checkpoint(
        launch, coordinator):  # noqa: F811
    run = start(launch, env={"IGNORE_TERM": "1"}, kill_grace="1")
    periodic = wait_for(lambda: checkpoint_key(coordinator, run), 30, "a periodic checkpoint upload")
    halt(coordinator, run)
    assert run.wait(30) == 0, controller_log(run)
    doc = status(coordinator, run)
    assert doc["state"] == LearnerState.LEARNER_HALTED, doc
    assert "killed after the grace period" in doc["message"], doc["message"]
    assert doc["step"] >= periodic["step"] and doc["step"] % 10 == 0


def test_a_malformed_halt_value_is_logged_with_its_key_and_ignored(launch, coordinator):  # noqa: F811
    run = start(launch)
    wait_for(lambda: checkpoint_key(coordinator, run), 30, "a first checkpoint upload")
    key = coordinator.keys.halt(run.job)
    coordinator.put(key, {"attempt": "soon"})
    wait_for(lambda: f"ignoring the value at {key}" in controller_log(run), 30, "the bad halt value logged")
    assert controller_log(run).count(f"ignoring the value at {key}") == 1
    assert status(coordinator, run)["state"] == LearnerState.LEARNER_RUNNING
    assert run.proc.poll() is None
    halt(coordinator, run)
    assert run.wait(30) == 0, controller_log(run)
    final = LearnerStatus.parse(status(coordinator, run))
    assert final.state == LearnerState.LEARNER_HALTED
    halted = Halted.parse(coordinator.get(coordinator.keys.learner_halted(run.job, 0))[0])
    stored = CheckpointStored.parse(checkpoint_key(coordinator, run))
    assert (halted.step, halted.checkpoint_uri) == (final.step, final.checkpoint_uri) == (stored.step, stored.uri)


def test_a_halt_for_another_attempt_is_ignored(launch, coordinator):  # noqa: F811
    run = start(launch, attempt=2)
    wait_for(lambda: checkpoint_key(coordinator, run), 30, "a first checkpoint upload")
    halt(coordinator, run, attempt=1)
    seen = checkpoint_key(coordinator, run)["step"]
    # the learner goes on: later checkpoints keep arriving, and it still runs
    wait_for(lambda: checkpoint_key(coordinator, run)["step"] >= seen + 20, 30, "two more checkpoints")
    assert status(coordinator, run)["state"] == LearnerState.LEARNER_RUNNING
    assert run.proc.poll() is None


def test_the_next_attempt_restores_the_checkpoint_and_continues(launch, coordinator, logstore):  # noqa: F811
    first = start(launch)
    wait_for(lambda: checkpoint_key(coordinator, first), 30, "a periodic checkpoint upload")
    halt(coordinator, first)
    assert first.wait(30) == 0
    step = status(coordinator, first)["step"]
    second = start(launch, attempt=2, job=first.job, checkpoint_uri=f"store://jobs/{first.job}/checkpoints/")
    wait_for(lambda: (status(coordinator, second) or {}).get("state") == LearnerState.LEARNER_RUNNING
             and (status(coordinator, second) or {}).get("attempt") == 2, 30, "attempt 2 to run")

    def lines():
        logstore.refresh()
        return [ln["line"] for ln in logstore.read(first.job).lines if ln["attempt"] == 2]

    found = wait_for(lambda: [x for x in lines() if x.startswith("start ")], 30, "the learner's first line")
    assert found == [f"start {step}"]
    assert f"restored the checkpoint at step {step}" in lines()


def learner_processes(run) -> list[psutil.Process]:
    """Everything under the controller once the user's program runs: guard, shell and `python learner.py`."""
    procs = psutil.Process(run.proc.pid).children(recursive=True)
    return procs if any(p.cmdline() == ["python", "learner.py"] for p in procs) else []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def test_a_killed_controller_takes_its_learner_with_it(launch, coordinator):  # noqa: F811
    run = start(launch)
    wait_for(lambda: (status(coordinator, run) or {}).get("state") == LearnerState.LEARNER_RUNNING, 30, "RUNNING")
    # The user's program is not the controller's child (a guard, then the shell that forked it, are
    # in between), so only something that acts on the controller's death can stop it.
    procs = wait_for(lambda: learner_processes(run), 10, "the learner process")
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait(10)
    wait_for(lambda: not alive(procs), 10, "the learner to die with its controller")


def store_copy(store, job: str, rank: int, step: int, complete: bool = True) -> None:
    prefix = f"jobs/{job}/checkpoints/{rank}/{step:012d}/"
    store.put_bytes(prefix + "model.bin", f"weights at {step}".encode())
    if complete:
        store.put_bytes(prefix + "checkpoint.json", json.dumps({"step": step}).encode())


def test_a_halt_while_preparing_stops_before_the_learner_starts_and_ends_halted(
        launch, coordinator, logstore, store_settings, unique):  # noqa: F811
    job = f"job-{unique}"
    store = store_from_settings(store_settings)
    for step in (10, 30):
        store_copy(store, job, 0, step)  # what attempt 1 left
    seen, stop_watch = watch_states(coordinator, job)
    coordinator.put(coordinator.keys.halt(job), {"attempt": 2, "requested_at": time.time()})
    run = start(launch, attempt=2, checkpoint_uri=f"store://jobs/{job}/checkpoints/")
    assert run.wait(30) == 0, controller_log(run)
    doc = status(coordinator, run)
    uri = f"store://jobs/{job}/checkpoints/0/{30:012d}/"
    assert doc["state"] == LearnerState.LEARNER_HALTED, doc
    assert (doc["step"], doc["checkpoint_uri"], doc["exit_code"]) == (30, uri, None)
    assert doc["message"] == f"halted (before the learner started); checkpoint at step 30 stored at {uri}"
    halted = coordinator.get(coordinator.keys.learner_halted(job, 0))[0]
    assert halted == {"attempt": 2, "step": 30, "checkpoint_uri": uri}
    wait_for(lambda: seen[-1:] == [LearnerState.LEARNER_HALTED], 10, "the final state in the watch")
    stop_watch.set()
    assert LearnerState.LEARNER_RUNNING not in seen and LearnerState.LEARNER_HALTING in seen, seen
    assert not (run.spec_path.parent / "learner-0" / "learner.py").exists(), "not even the code was fetched"
    logstore.refresh()
    assert [ln["line"] for ln in logstore.read(job).lines] == [doc["message"]]
    assert store.exists(f"jobs/{job}/logs/0-2.jsonl"), "the log archive is uploaded as usual"


def test_the_next_attempt_restores_the_newest_step_every_rank_stored(
        launch, coordinator, logstore, store_settings, unique):  # noqa: F811
    job = f"job-{unique}"
    store = store_from_settings(store_settings)
    for rank in (0, 1):
        for step in (10, 20):
            store_copy(store, job, rank, step)
    store_copy(store, job, 0, 30)                  # rank 1 never stored step 30 ...
    store_copy(store, job, 1, 30, complete=False)  # ... or not completely
    runs = [start(launch, attempt=2, job=job, rank=r, world_size=2, checkpoint_uri=f"store://jobs/{job}/checkpoints/")
            for r in (0, 1)]

    def first_lines():
        logstore.refresh()
        return sorted((ln["learner"], ln["line"]) for ln in logstore.read(job).lines
                      if ln["line"].startswith(("start ", "restored ")))

    wait_for(lambda: len(first_lines()) == 4, 30, "both learners to start")
    assert first_lines() == [(0, "restored the checkpoint at step 20"), (0, "start 20"),
                             (1, "restored the checkpoint at step 20"), (1, "start 20")]
    halt(coordinator, runs[0])
    assert [r.wait(30) for r in runs] == [0, 0], [controller_log(r) for r in runs]
    docs = [status(coordinator, r) for r in runs]
    assert [d["state"] for d in docs] == [LearnerState.LEARNER_HALTED] * 2, docs
    assert all(d["step"] > 20 for d in docs)


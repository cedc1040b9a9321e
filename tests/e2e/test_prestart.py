"""Prestarted trials on the embedded stack: held behind their gate, started the moment a slot frees.

Each trial's learner prints the wall-clock time it started and ended. A
held trial must show DEPLOYING with a reason saying it is held, its learner
must not start before a running trial's learner ended, no more than
`max_parallel` learners may ever run at once, a Trainer SIGKILLed while a
trial is held must lose nothing and start nothing twice, and cancelling an
experiment must cancel its held trial without its learner ever starting.
While held, the trial's learner process (the guard, or the sandbox's
entry) is already started and waiting on its hold pipe (`--hold`), and no
process of the user's command runs; a cancel leaves none of it behind.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import psutil

from tests.chaos_support import most_at_once
from tests.e2e.test_embedded_stack import cli_json, run_cli
from tests.e2e.test_experiments import _sigkill_trainer
from tests.servers import holds_its_hold_pipe, wait_for

SCRIPT = textwrap.dedent("""
    import os, sys, time
    print("START", time.time(), flush=True)
    time.sleep(float(sys.argv[1]))
    print("END", time.time(), flush=True)
""")


def write_recipe(tmp_path: Path, name: str, *, trials: int, max_parallel: int, seconds: float) -> Path:
    code = tmp_path / f"{name}-code"
    code.mkdir()
    (code / "main.py").write_text(SCRIPT)
    recipe = {"kind": "experiment", "name": name, "framework": "custom", "command": f"python main.py {seconds}",
              "code": str(code), "resources": {"cpus": 0.25, "memory": "256Mi"},
              "parameters": {"i": {"range": [0, trials - 1], "sampling": "int"}}, "mode": "grid",
              "max_parallel": max_parallel, "prestart": 1}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(recipe))
    return path


def job(env: dict, job_id: str) -> dict:
    return cli_json(env, "status", job_id)


def held(env: dict, job_id: str) -> dict | None:
    """The job while it is DEPLOYING behind its closed gate (its reason says so), else None."""
    try:
        got = job(env, job_id)
    except AssertionError:  # not submitted yet
        return None
    return got if got["state"] == "deploying" and "held" in got["reason"] else None


def learner_span(env: dict, job_id: str) -> tuple[float, float]:
    """(start, end) as the learner itself printed them; the learner must have run exactly once."""
    marks: dict[str, list[float]] = {}
    for line in run_cli(env, "logs", job_id).stdout.splitlines():
        parts = line.split()
        for i, word in enumerate(parts[:-1]):
            if word in ("START", "END"):
                marks.setdefault(word, []).append(float(parts[i + 1]))
    assert len(marks["START"]) == 1 and len(marks["END"]) == 1, (job_id, marks)
    return marks["START"][0], marks["END"][0]


def processes_of(job_id: str) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(the job's held learner processes, its processes running the user's command), by TF_JOB_ID. Held: the
    guard or sandbox entry started with a hold, and for a bare `python ...` command (held in its interpreter)
    the shell and the interpreter while they still have the hold pipe open."""
    held_procs, user = [], []
    for p in psutil.process_iter():
        try:
            environ = p.environ()
            if p.status() == psutil.STATUS_ZOMBIE or environ.get("TF_JOB_ID") != job_id:
                continue
            is_held = {"--hold", "--pass-hold"} & set(p.cmdline()) or holds_its_hold_pipe(environ, p.pid)
            (held_procs if is_held else user).append(p)
        except psutil.Error:
            continue
    return held_procs, user


def test_a_held_trial_starts_only_when_a_slot_frees_and_a_trainer_kill_loses_nothing(stack, tmp_path):
    env, state, _ = stack
    trials = 5
    exp = cli_json(env, "submit", str(write_recipe(tmp_path, "held", trials=trials, max_parallel=2, seconds=4)))
    ids = [f"{exp['id']}-{i}" for i in range(trials)]
    waiting = wait_for(lambda: held(env, ids[2]), 240, "trial 2 to be deployed and held", interval=0.5)
    assert waiting["reason"].startswith("preparing: learner 0: held"), waiting["reason"]
    # what a held job shows: DEPLOYING, its learner preparing and saying it is held
    assert [(ls["state"], ls["message"].split(":")[0]) for ls in waiting["learners"]] == [("preparing", "held")], \
        waiting["learners"]
    _sigkill_trainer(state)  # with a trial held
    run_cli(env, "up", timeout=180)

    def done() -> dict | None:
        got = cli_json(env, "experiment", exp["id"])
        return got if got["state"] in ("completed", "failed", "cancelled") else None

    final = wait_for(done, 600, "the experiment to end", interval=2.0)
    assert final["state"] == "completed", (final["reason"], [(t["state"], t["reason"]) for t in final["trials"]])
    jobs = cli_json(env, "status", "--label", f"experiment={exp['id']}", "--limit", "100")
    jobs = jobs["jobs"] if isinstance(jobs, dict) else jobs
    assert sorted(j["id"] for j in jobs) == sorted(ids)  # nothing lost, nothing submitted twice
    assert all(j["attempt"] == 1 and j["state"] == "completed" for j in jobs), jobs
    spans = {i: learner_span(env, i) for i in ids}
    assert most_at_once(list(spans.values())) <= 2, spans
    # the held trial's learner started only after one of the two running learners ended
    assert spans[ids[2]][0] >= min(spans[ids[0]][1], spans[ids[1]][1]), spans


def test_cancelling_an_experiment_cancels_its_held_trial_before_its_learner_starts(stack, tmp_path):
    env, _, _ = stack
    exp = cli_json(env, "submit", str(write_recipe(tmp_path, "cancel", trials=3, max_parallel=1, seconds=60)))
    ids = [f"{exp['id']}-{i}" for i in range(3)]
    wait_for(lambda: held(env, ids[1]), 240, "trial 1 to be deployed and held", interval=0.5)
    holding = wait_for(lambda: processes_of(ids[1])[0], 30, "trial 1's learner process, held")
    assert processes_of(ids[1])[1] == [], "nothing of trial 1's command runs while it is held"
    run_cli(env, "experiment", exp["id"], "--cancel")
    wait_for(lambda: all(job(env, i)["state"] == "cancelled" for i in ids[:2]), 120,
             "the running and the held trial to be cancelled", interval=1.0)
    history = job(env, ids[1])["history"]
    assert "running" not in [h["to"] for h in history], history
    assert "START" not in run_cli(env, "logs", ids[1], check=False).stdout
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in holding)
             and processes_of(ids[1]) == ([], []), 30, "nothing of the held trial left running")
    final = wait_for(lambda: (x := cli_json(env, "experiment", exp["id"]))["state"] == "cancelled" and x, 120,
                     "the experiment to be cancelled", interval=1.0)
    assert all(t["job_id"] in (None, "", *ids[:2]) for t in final["trials"]), final["trials"]  # nothing more started

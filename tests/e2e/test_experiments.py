"""An 8-trial sweep on the embedded stack, through the CLI, with the Trainer SIGKILLed mid-sweep.

Each trial is a tiny script that reads its learning rate from the
environment the experiment passes (PARAM_LR), "trains" for a few
batches and reports a loss that is smallest at lr = 0.03 through the metrics
file (the `report_metrics` convention). The experiment must find that trial,
and the Trainer killed while trials run and started again (as `trainforge up`
does) must lose none and start none twice.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

import psutil

from tests.e2e.test_embedded_stack import cli_json, run_cli
from tests.servers import wait_for

SCRIPT = textwrap.dedent("""
    import json, os, time
    lr = float(os.environ["PARAM_LR"])
    path = os.environ.get("TF_METRICS_FILE") or os.path.join(os.environ.get("TF_WORKDIR", "."), ".tf-metrics.jsonl")
    for step in range(1, 4):
        time.sleep(0.3)
        loss = (lr - 0.03) ** 2 * 100 + 1.0 / step
        with open(path, "a") as f:
            f.write(json.dumps({"step": step, "ts": time.time(), "loss": loss}) + "\\n")
        print(f"step {step} lr {lr} loss {loss:.4f}", flush=True)
""")
LRS = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08]


def write_recipe(tmp_path: Path) -> Path:
    code = tmp_path / "sweep-code"
    code.mkdir()
    (code / "main.py").write_text(SCRIPT)
    recipe = {"kind": "experiment", "name": "lr-sweep", "framework": "custom", "command": "python main.py",
              "code": str(code), "resources": {"cpus": 0.5, "memory": "256Mi"},
              "parameters": {"lr": LRS}, "mode": "grid", "max_parallel": 2,
              "objective": {"metric": "loss", "goal": "minimize"}}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(recipe))
    return path


def _sigkill_trainer(state: Path) -> None:
    pid = int((state / "pids" / "trainer.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10,
             "the Trainer to die")


def test_an_eight_trial_sweep_finds_the_best_and_survives_a_trainer_kill(stack, tmp_path):
    env, state, _ = stack
    exp = cli_json(env, "submit", str(write_recipe(tmp_path)))
    assert exp["state"] == "running" and exp["trial_count"] == 8

    def submitted() -> int:
        return sum(1 for t in cli_json(env, "experiment", exp["id"])["trials"] if t["job_id"])

    wait_for(lambda: submitted() >= 3, 240, "three trials to be submitted", interval=1.0)
    _sigkill_trainer(state)
    run_cli(env, "up", timeout=180)  # starts the Trainer again, leaves the rest alone

    def done() -> dict | None:
        got = cli_json(env, "experiment", exp["id"])
        return got if got["state"] in ("completed", "failed", "cancelled") else None

    final = wait_for(done, 600, "the sweep to end", interval=2.0)
    assert final["state"] == "completed", (final["reason"], [(t["state"], t["reason"]) for t in final["trials"]])
    best = next(t for t in final["trials"] if t["best"])
    assert best["params"] == {"lr": 0.03} and final["best_trial"] == LRS.index(0.03)
    assert all(t["state"] == "completed" and t["objective"] is not None for t in final["trials"]), final["trials"]
    # the trials are ordinary jobs, each exactly once, each with one attempt
    jobs = cli_json(env, "status", "--label", f"experiment={exp['id']}", "--limit", "100")
    jobs = jobs["jobs"] if isinstance(jobs, dict) else jobs
    assert sorted(j["id"] for j in jobs) == sorted(f"{exp['id']}-{i}" for i in range(8))
    assert all(j["attempt"] == 1 for j in jobs)
    table = run_cli(env, "experiment", exp["id"]).stdout
    assert "best: trial 2" in table and "lr=0.03" in table


STAGE = textwrap.dedent("""
    import json, os, pathlib, sys, time
    stage = sys.argv[1]
    out = pathlib.Path(os.environ["TF_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    metrics = os.environ.get("TF_METRICS_FILE") or os.path.join(os.environ.get("TF_WORKDIR", "."), ".tf-metrics.jsonl")
    if stage == "sweep":
        lr = float(os.environ["PARAM_LR"])
        loss = abs(lr - 0.2)
        with open(metrics, "a") as f:
            f.write(json.dumps({"step": 1, "ts": time.time(), "loss": loss}) + "\\n")
        (out / "model.json").write_text(json.dumps({"lr": lr, "trained": 1}))
    elif stage == "train":
        model = json.loads(pathlib.Path("inputs/sweep/0/model.json").read_text())
        model["trained"] += 10
        (out / "model.json").write_text(json.dumps(model))
    else:
        model = json.loads(pathlib.Path("inputs/train/0/model.json").read_text())
        (out / "report.json").write_text(json.dumps({**model, "evaluated": True}))
    print(stage, "done", flush=True)
""")


def test_a_three_node_workflow_passes_outputs_along(stack, tmp_path):
    env, _, _ = stack
    code = tmp_path / "wf-code"
    code.mkdir()
    (code / "main.py").write_text(STAGE)
    common = {"framework": "custom", "resources": {"cpus": 0.5, "memory": "256Mi"}}
    recipe = {"kind": "workflow", "name": "tune-train-eval", "code": str(code), "experiments": {
        "sweep": {**common, "command": "python main.py sweep", "parameters": {"lr": [0.1, 0.2, 0.4]},
                  "mode": "grid", "max_parallel": 2, "objective": {"metric": "loss", "goal": "minimize"}},
        "train": {**common, "command": "python main.py train", "depends_on": ["sweep"]},
        "evaluate": {**common, "command": "python main.py evaluate", "depends_on": ["train"]}}}
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(recipe))
    wf = cli_json(env, "submit", str(path))

    def ended() -> dict | None:
        got = cli_json(env, "workflow", wf["id"])
        return got if got["state"] in ("completed", "failed", "cancelled") else None

    final = wait_for(ended, 600, "the workflow to end", interval=2.0)
    assert final["state"] == "completed", final
    assert [n["state"] for n in final["nodes"]] == ["completed"] * 3
    assert final["nodes"][0]["best_trial"] == 1  # lr 0.2
    evaluate = final["nodes"][2]["experiment_id"]
    dest = tmp_path / "report"
    cli_json(env, "download", f"{evaluate}-0", "-o", str(dest))
    report = json.loads((dest / "0" / "report.json").read_text())
    assert report == {"lr": 0.2, "trained": 11, "evaluated": True}
    tree = run_cli(env, "workflow", wf["id"]).stdout
    assert "sweep completed" in tree and "evaluate completed" in tree

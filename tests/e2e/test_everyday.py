"""Everyday use on the embedded stack, through the CLI: results back bit for bit, team secrets that leak nowhere.

Every service runs as its own process (`trainforge up`); the tests drive
the platform only through the `trainforge` CLI, then look behind its back
(MongoDB, etcd, the state directory's files) to check what was stored.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.e2e.test_embedded_stack import CLI, ROOT, cli_json, run_cli, wait_terminal
from tests.servers import wait_for
from trainforge_services.common.adapters import mongo
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.devstack.launcher import recorded_plan

WRITER = textwrap.dedent("""
    import os, random, pathlib
    rank = int(os.environ["TF_RANK"])
    out = pathlib.Path(os.environ["TF_OUTPUT_DIR"])
    (out / "nested" / "deeper").mkdir(parents=True, exist_ok=True)
    rng = random.Random(1000 + rank)
    (out / "weights.bin").write_bytes(rng.randbytes(3 * 1024 * 1024 + rank))
    (out / "nested" / "deeper" / "small.txt").write_text(f"learner {rank}\\n")
    (out / "empty").write_bytes(b"")
    print("wrote outputs of", rank)
""")


def expected_outputs(rank: int) -> dict[str, bytes]:
    rng = random.Random(1000 + rank)
    return {"weights.bin": rng.randbytes(3 * 1024 * 1024 + rank),
            "nested/deeper/small.txt": f"learner {rank}\n".encode(), "empty": b""}


def write_job(tmp_path: Path, name: str, script: str, *, learners: int = 1, env: dict | None = None) -> Path:
    code = tmp_path / f"{name}-code"
    code.mkdir()
    (code / "main.py").write_text(script)
    manifest = {"name": name, "framework": "custom", "learners": learners, "command": "python main.py",
                "code": str(code), "outputs": "outputs/", "env": env or {},
                "resources": {"cpus": 0.5, "memory": "512Mi"}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(manifest))
    return path


def test_download_reproduces_a_two_learner_jobs_outputs_bit_for_bit(stack, tmp_path):
    env, _, _ = stack
    job_id = cli_json(env, "submit", str(write_job(tmp_path, "writes", WRITER, learners=2)))["id"]
    job = wait_terminal(env, job_id, 180)
    assert job["state"] == "completed", job
    dest = tmp_path / "got"
    got = cli_json(env, "download", job_id, "-o", str(dest))
    assert len(got["files"]) == 6
    for rank in (0, 1):
        for rel, data in expected_outputs(rank).items():
            assert (dest / str(rank) / rel).read_bytes() == data, (rank, rel)
    # one learner only, and the progress bar of a person's terminal does not break anything
    one = run_cli(env, "download", job_id, "-o", str(tmp_path / "one"), "--learner", "1")
    assert "checksums verified" in one.stdout
    assert sorted(p.relative_to(tmp_path / "one").as_posix() for p in (tmp_path / "one").rglob("*") if p.is_file()) \
        == ["1/empty", "1/nested/deeper/small.txt", "1/weights.bin"]


SECRET_USER = textwrap.dedent("""
    import hashlib, os, pathlib, time
    value = os.environ["WANDB_API_KEY"]
    out = pathlib.Path(os.environ["TF_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "hash.txt").write_text(hashlib.sha256(value.encode()).hexdigest())
    print("the key has", len(value), "characters; plain var is", os.environ["PLAIN"])
    time.sleep(3)  # long enough for the test to look at etcd while the job runs
""")


def _every_file_text(root: Path, skip: set[Path]) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p not in skip}


def test_a_secret_reaches_the_learner_and_leaks_nowhere(stack, tmp_path):
    env, state, _ = stack
    value = "wandb-" + hashlib.sha256(tmp_path.name.encode()).hexdigest()[:24]
    seen: list[str] = []  # every response the CLI printed

    def cli(*args, **kw):
        proc = run_cli(env, *args, **kw)
        seen.append(proc.stdout + proc.stderr)
        return proc

    proc = subprocess.run([*CLI, "secret", "set", "wandb", "--json"], input=value + "\n", env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    seen.append(proc.stdout + proc.stderr)
    assert [s["name"] for s in json.loads(cli("secret", "list", "--json").stdout)["secrets"]] == ["wandb"]

    manifest = write_job(tmp_path, "secretive", SECRET_USER,
                         env={"WANDB_API_KEY": {"secret": "wandb"}, "PLAIN": "visible"})
    job_id = json.loads(cli("submit", str(manifest), "--json").stdout)["id"]
    plan = recorded_plan(state)
    settings = plan.api_settings()
    coord = Coordinator.of(settings.model_copy(update=plan.etcd_login("lcm")))  # the LCM's login: every key
    etcd_seen: list[str] = []

    def running_and_etcd():
        etcd_seen.append(json.dumps(coord.list(settings.etcd_prefix)[0]))
        return json.loads(cli("status", job_id, "--json").stdout)["state"] in ("running", "storing", "completed")

    wait_for(running_and_etcd, 60, "the job to run", interval=0.5)
    job = wait_terminal(env, job_id, 120)
    assert job["state"] == "completed", job
    etcd_seen.append(json.dumps(coord.list(settings.etcd_prefix)[0]))
    coord.close()

    # it reached the learner's environment
    cli("download", job_id, "-o", str(tmp_path / "out"), "--json")
    assert (tmp_path / "out" / "0" / "hash.txt").read_text() == hashlib.sha256(value.encode()).hexdigest()
    logs = cli("logs", job_id, "--json").stdout
    assert "plain var is visible" in logs

    # ... and nowhere else: API responses, the audit log, every MongoDB document, etcd, every file
    bootstrap = json.loads(run_cli(env, "admin", "bootstrap", "--team", "ops", "--json").stdout)
    admin_env = {**env, "TRAINFORGE_API_KEY": bootstrap["key"]}
    seen.append(run_cli(admin_env, "admin", "audit", "--limit", "1000", "--json").stdout)
    assert any("/v1/team/secrets/wandb" in s for s in seen[-1:])  # the write was audited (by path)
    seen.append(json.dumps(json.loads(cli("status", job_id, "--json").stdout)))
    db = mongo.connect(settings.mongo_url, settings.mongo_db)
    try:
        collections = {name: list(db[name].find()) for name in db.list_collection_names()}
    finally:
        db.client.close()
    documents = json.dumps(collections, default=str)
    assert [d["name"] for d in collections["secrets"]] == ["wandb"]  # stored, sealed
    for where, text in [("CLI output", "\n".join(seen)), ("MongoDB", documents), ("etcd", "\n".join(etcd_seen))]:
        assert value not in text, f"the secret's value is in {where}"
    # the learner spec files carry it, readable by their owner only; no other file of the stack does
    specs = [p for p in state.rglob("learner-*.json") if value.encode() in p.read_bytes()]
    assert specs and all(p.stat().st_mode & 0o777 == 0o600 for p in specs)
    leaks = [p for p, data in _every_file_text(state, set(specs)).items() if value.encode() in data]
    assert not leaks, leaks


def test_a_missing_secret_fails_the_job_naming_it(stack, tmp_path):
    env, _, _ = stack
    manifest = write_job(tmp_path, "nosecret", "print('never runs')", env={"TOKEN": {"secret": "not-set"}})
    job_id = cli_json(env, "submit", str(manifest))["id"]
    job = wait_terminal(env, job_id, 60)
    assert job["state"] == "failed" and "not-set" in job["reason"], job


def test_a_bad_secret_name_is_refused(stack):
    env, _, _ = stack
    proc = subprocess.run([sys.executable, "-m", "trainforge.cli", "secret", "set", "Bad Name"], input="x",
                          env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 1 and "name" in proc.stderr

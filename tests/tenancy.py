"""Cross-tenant `data:` probes on a running stack, shared by every backend's tier (local, docker, kube test node).

Team `local` (the stack's own key) stores a job's outputs holding a secret;
a second team then names them, every team's jobs, the whole store and that
job's checkpoints in `data:`, and each submit must be refused with the rule,
naming the field and the source, with nothing of the secret in any answer.
A prefix a platform admin published to the second team is read by its job
on that backend, which shows the Trainer's grant reaching the controller
(the controller fetches nothing it was not granted).
"""

from __future__ import annotations

import json
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.test_embedded_stack import CLI, ROOT, cli_json, wait_terminal
from trainforge_services.common.adapters.objectstore import store_from_settings
from trainforge_services.devstack.launcher import recorded_plan

WRITES_SECRET = "import os, pathlib\npathlib.Path(os.environ['TF_OUTPUT_DIR'], 'secret.txt').write_text({!r})\n"
READS = ("import pathlib\nfor p in sorted(pathlib.Path('got').rglob('*')):\n"
         "    print('read', p.relative_to('got'), p.read_text() if p.is_file() else '')\n")


@dataclass
class Teams:
    admin: dict
    local: dict
    other: dict
    other_team: str
    secret: str
    secret_job: str


def job_manifest(tmp_path: Path, name: str, script: str, data: list[dict]) -> Path:
    code = tmp_path / f"{name}-code"
    code.mkdir()
    (code / "main.py").write_text(script)
    manifest = {"name": name, "framework": "custom", "command": "python main.py", "code": str(code),
                "outputs": "outputs/", "data": data, "resources": {"cpus": 0.5, "memory": "512Mi"}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(manifest))
    return path


def submit(env: dict, manifest: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "submit", str(manifest), "--json"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def two_teams(env: dict, tmp_path: Path, timeout: float = 180) -> Teams:
    """Team local's job leaves outputs holding a secret; a second team with a member key; an admin key."""
    secret = "secret-" + secrets.token_hex(12)
    job_id = cli_json(env, "submit", str(job_manifest(tmp_path, "keeps-secret", WRITES_SECRET.format(secret), [])))["id"]
    job = wait_terminal(env, job_id, timeout)
    assert job["state"] == "completed", job
    admin = {**env, "TRAINFORGE_API_KEY": cli_json(env, "admin", "bootstrap", "--team", "ops")["key"]}
    other = "mallory-" + secrets.token_hex(3)
    cli_json(admin, "admin", "teams", "create", other)
    key = cli_json(admin, "admin", "keys", "create", f"{other}-member", "--team", other)["key"]
    return Teams(admin, env, {**env, "TRAINFORGE_API_KEY": key}, other, secret, job_id)


def refused_probes(teams: Teams, tmp_path: Path) -> list[str]:
    """Each cross-team `data:` source the other team names is refused at submit; the answers, for callers."""
    victim = teams.secret_job
    answers = []
    for i, source in enumerate([f"store://jobs/{victim}/outputs/", f"store://jobs/{victim}/outputs/0/secret.txt",
                                "store://jobs/", "store://", f"store://jobs/{victim}/checkpoints/",
                                f"store://jobs/{victim}/code.tar.gz", f"store://jobs/./{victim}/outputs/"]):
        proc = submit(teams.other, job_manifest(tmp_path, f"probe-{i}", READS, [{"source": source, "path": "got/"}]))
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"{source} was accepted: {text}"
        assert "data[0].source" in text, text
        if "/./" not in source:
            assert "may not read" in text and "published to its team" in text, text
        assert teams.secret not in text
        answers.append(text)
    # the other team has no job at all: nothing was stored for any probe
    assert cli_json(teams.other, "status") == []
    return answers


def published_read(teams: Teams, stack_state: Path, tmp_path: Path, timeout: float = 180) -> str:
    """An admin publishes a data set to the other team, whose job reads it (completed); a sibling prefix and the
    parent stay refused. The job's id."""
    folder = "datasets/" + secrets.token_hex(4)
    store = store_from_settings(recorded_plan(stack_state).api_settings())
    store.put_bytes(f"{folder}/part-0.txt", b"published rows\n")
    store.put_bytes(f"{folder}-private/part-0.txt", b"not published\n")
    published = cli_json(teams.admin, "admin", "published", "add", f"store://{folder}/", "--team", teams.other_team)
    assert published == {"prefix": f"store://{folder}/", "teams": [teams.other_team]}
    for source in (f"store://{folder}-private/", "store://datasets/"):
        proc = submit(teams.other, job_manifest(tmp_path, "sibling-" + secrets.token_hex(2), READS,
                                                [{"source": source, "path": "got/"}]))
        assert proc.returncode != 0 and f"store://{folder}/" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    manifest = job_manifest(tmp_path, "reads-published", READS, [{"source": f"store://{folder}/", "path": "got/"}])
    job_id = json.loads(submit(teams.other, manifest).stdout)["id"]
    job = wait_terminal(teams.other, job_id, timeout)
    assert job["state"] == "completed", job
    lines = [line["line"] for line in cli_json(teams.other, "logs", job_id)["lines"]]
    assert "read part-0.txt published rows" in lines, lines
    return job_id

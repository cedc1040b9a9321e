"""Real jobs on the local backend for the sandbox tests: an LCM lifecycle with the real servers around it.

`platform` starts a Trainer (gRPC, the fake of test_monitor_flow) and the
REST API (uvicorn) on loopback ports beside the session's etcd, Mongo-wire
and log-store servers, and gives `run(script)`: a job whose code archive
holds `hostile.py`, run as `python hostile.py` by the local backend, whose
final learner status is returned. A hostile script prints `BLOCKED <what>`
for each attempt that failed and `ESCAPED <what>` for one that worked.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.integration.test_controller_run import pack  # noqa: F401 - the hostile tests pack their code with it
from tests.integration.test_monitor_process import start_trainer
from tests.servers import free_port, serve_app, wait_for
from trainforge_services.api.app import create_app
from trainforge_services.common.adapters.objectstore import LocalStore, store_from_settings
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.settings import ApiSettings, LcmSettings
from trainforge_services.common.states import LEARNER_FINAL
from trainforge_services.lcm.backends.base import TeamQuota
from trainforge_services.lcm.backends.local import LocalBackend
from trainforge_services.lcm.lifecycle import JobDeployment, Lifecycle


@dataclass
class Platform:
    lifecycle: Lifecycle
    coordinator: object
    settings: LcmSettings
    trainer_port: int
    api_port: int

    @property
    def state_dir(self) -> Path:
        return Path(self.settings.state_dir).resolve()

    def workdir(self, job: str, rank: int = 0, attempt: int = 1) -> Path:
        return self.state_dir / "work" / job / str(attempt) / f"learner-{rank}"

    def deploy(self, job: str, script: str, *, learners: int = 1, env: dict | None = None,
               team_egress: str | None = None, **resources) -> None:
        store = store_from_settings(self.settings)
        store.put_bytes(f"jobs/{job}/code.tar.gz", pack({"hostile.py": script}))
        manifest = Manifest(name="hostile", framework="custom", learners=learners, command="python hostile.py",
                            env=env or {}, resources={"cpus": 0.5, "memory": "256Mi", **resources})
        quota = None if team_egress is None else TeamQuota(egress=team_egress)  # the team's own egress policy
        self.lifecycle.deploy(JobDeployment(job_id=job, team="team-a", attempt=1, manifest=manifest,
                                            code_uri=f"store://jobs/{job}/code.tar.gz", team_quota=quota))

    def status(self, job: str, rank: int = 0) -> dict | None:
        return self.coordinator.get(self.coordinator.keys.learner_status(job, rank))[0]

    def final(self, job: str, rank: int = 0, timeout: float = 90) -> dict:
        return wait_for(lambda: (d := self.status(job, rank)) and d["state"] in LEARNER_FINAL and d, timeout,
                        f"job {job} learner {rank} to end")

    def run(self, job: str, script: str, **kw) -> dict:
        self.deploy(job, script, **kw)
        return self.final(job)

    def log(self, job: str, rank: int = 0) -> str:
        attempt_dir = self.state_dir / "work" / job / "1"
        return "\n".join(p.read_text(errors="replace") for p in sorted(attempt_dir.glob("*.log*")))


@pytest.fixture
def platform(store_settings, coordinator, tmp_path) -> Iterator[Platform]:
    trainer_port = free_port()
    server, _ = start_trainer(trainer_port)
    app = create_app(ApiSettings(dev_mode=True, retention_interval=0), trainer=InMemoryTrainer(), identity=object(), logs=object(),
                     objects=LocalStore(tmp_path / "api-objects"), audit=object())
    settings = LcmSettings(**{**store_settings.model_dump(), "trainer_address": f"127.0.0.1:{trainer_port}",
                              "python": sys.executable, "local_gpus": 0, "lease_ttl": 5})
    lifecycle = Lifecycle.from_settings(settings, LocalBackend(settings, kill_grace=5), coordinator,
                                        start_timeout=60, supervise_interval=1.0)
    with serve_app(app) as url:
        yield Platform(lifecycle, coordinator, settings, trainer_port, int(url.rsplit(":", 1)[1]))
        for job in lifecycle.running_jobs():
            lifecycle.kill(job.job_id)
        for path in (Path(settings.state_dir).resolve() / "lcm" / "local").glob("*.json"):
            lifecycle.kill(json.loads(path.read_text())["job_id"])
        lifecycle.close()
    server.stop(0).wait()


def outcome_lines(doc: dict) -> tuple[list[str], list[str]]:
    """(BLOCKED lines, ESCAPED lines) of a hostile learner's last output."""
    tail = doc.get("tail") or []
    return [ln for ln in tail if ln.startswith("BLOCKED")], [ln for ln in tail if ln.startswith("ESCAPED")]

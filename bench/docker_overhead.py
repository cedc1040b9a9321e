"""Container start overhead: the docker backend against the local backend, on the same machine in one run.

One learner whose command is `python -c "import torch"` is deployed through
the LCM's lifecycle (real etcd, log store and object store; real job monitor
and controller), alternately on the local backend and on the docker backend
(a private dockerd from tools/engine/, the learner image), N times each.
Measured per run: from `deploy` to the learner's status RUNNING (the
controller started the command: for docker, the runner, which then creates
and starts the container) and to COMPLETED (the command ran in its container
and exited, the container was removed, the controller stored its outputs). The
difference between the backends' medians is what a container costs per
learner start. Usage:

    .venv/bin/python bench/docker_overhead.py [-n 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import servers  # noqa: E402
from tests.engine import start_engine  # noqa: E402
from trainforge_services.common.adapters.etcd import Coordinator  # noqa: E402
from trainforge_services.common.contracts.etcd import LearnerStatus  # noqa: E402
from trainforge_services.common.manifest import Manifest  # noqa: E402
from trainforge_services.common.settings import LcmSettings  # noqa: E402
from trainforge_services.common.states import LEARNER_STARTED, LearnerState  # noqa: E402
from trainforge_services.lcm.backends.docker import DockerBackend  # noqa: E402
from trainforge_services.lcm.backends.local import LocalBackend  # noqa: E402
from trainforge_services.lcm.lifecycle import JobDeployment, LifecycleManager  # noqa: E402

COMMAND = 'python -c "import torch"'


def one_run(lcm: LifecycleManager, coord: Coordinator, job_id: str) -> tuple[float, float]:
    manifest = Manifest(name="bench-overhead", learners=1, command=COMMAND,
                        resources={"cpus": 1, "memory": "1Gi"})
    key = coord.keys.learner_status(job_id, 0)
    started = time.monotonic()
    lcm.deploy(JobDeployment(job_id=job_id, team="bench", attempt=1, manifest=manifest))
    running = None
    deadline = started + 180
    while time.monotonic() < deadline:
        status = LearnerStatus.parse_or_none(coord.get(key)[0])
        if status is not None:
            if running is None and status.state in LEARNER_STARTED:
                running = time.monotonic() - started
            if status.state == LearnerState.LEARNER_COMPLETED:
                done = time.monotonic() - started
                lcm.kill(job_id)
                return running or done, done
            if status.final:
                raise RuntimeError(f"{job_id} ended {status.state.name}: {status.message}")
        time.sleep(0.02)
    raise TimeoutError(f"{job_id} did not complete within 180s")


def summary(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"median {statistics.median(xs):6.2f}s  IQR {q[0]:.2f}-{q[2]:.2f}s  min {min(xs):.2f}s  max {max(xs):.2f}s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=7, help="runs per backend (alternated)")
    args = ap.parse_args()
    t0 = time.monotonic()
    daemon = start_engine()
    engine_s = time.monotonic() - t0
    etcd, osmem = servers.start_etcd(), servers.start_osmem()
    tmp = Path(tempfile.mkdtemp(prefix="tf-bench-docker-"))
    os.environ.setdefault("TF_STACK_ID", f"bench-{os.getpid()}")
    try:
        coord = Coordinator(etcd.address, prefix="/bench")
        lcms = {}
        for name in ("local", "docker"):
            settings = LcmSettings(backend=name, state_dir=tmp / name, etcd_endpoints=etcd.address,
                                   etcd_prefix="/bench", logstore_url=osmem.url, logstore_index="bench-logs",
                                   objectstore_url=(tmp / "objects").as_uri(), dev_mode=True,
                                   trainer_address="127.0.0.1:1", local_gpus=0, docker_url=daemon.url)
            backend = DockerBackend(settings) if name == "docker" else LocalBackend(settings)
            lcms[name] = LifecycleManager.from_settings(settings, backend, coord, start_timeout=120)
        times: dict[str, list[tuple[float, float]]] = {"local": [], "docker": []}
        one_run(lcms["docker"], coord, "warmup-docker")  # page cache: the first run of each reads torch from disk
        one_run(lcms["local"], coord, "warmup-local")
        for i in range(args.n):
            for name in ("local", "docker") if i % 2 == 0 else ("docker", "local"):
                times[name].append(one_run(lcms[name], coord, f"{name}-{i}"))
        print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs; engine: {daemon.engine.info().version}; "
              f"engine start (setup cached) {engine_s:.1f}s")
        print(f"command: {COMMAND}; {args.n} runs per backend, alternated")
        for name, rows in times.items():
            print(f"{name:7s} deploy->RUNNING   {summary([r[0] for r in rows])}")
            print(f"{name:7s} deploy->COMPLETED {summary([r[1] for r in rows])}")
        for i, label in ((0, "RUNNING"), (1, "COMPLETED")):
            delta = (statistics.median([r[i] for r in times["docker"]])
                     - statistics.median([r[i] for r in times["local"]]))
            print(f"container overhead to {label}: {delta:+.2f}s (difference of medians)")
        for lcm in lcms.values():
            lcm.close()
        coord.close()
    finally:
        etcd.cleanup()
        osmem.cleanup()
        daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

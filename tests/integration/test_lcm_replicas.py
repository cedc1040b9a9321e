"""Two LCM processes on the local backend, one elected: SIGKILL the leader between deploys.

Real etcd, job monitors, controllers and learners; a fake Trainer records
the monitors' reports. The Trainer's own client (`GrpcLcm`, listing both
replicas) deploys two jobs, the leader is SIGKILLed, the follower takes over
(adopting the running attempts from the shared records), the client
deploys the first job again (idempotent: nothing starts twice) and two more.
Every learner runs exactly once and every job's end is reported once.

A dispatcher's resent deploy can reach the LCM after the attempt ended (its
check of the job's state came first): the second variant holds the follower
stopped until the first two jobs ended, so the new leader takes over attempts
that are over, and every job's deploy is resent once more after it ended. An
ended attempt is never run again. After the KillJobs every deploy is resent
again: refused (Conflict, the attempt was killed), also by a replica started
afresh after the leader is SIGKILLed once more.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.test_monitor_process import start_trainer
from tests.servers import free_port, wait_for
from trainforge_services.common import rpcauth
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.errors import Conflict, Unavailable
from trainforge_services.common.states import JobState
from trainforge_services.lcm.backends.local.processes import job_processes
from trainforge_services.trainer.lcm_client import GrpcLcm

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]
LEASE = 2


def _manifest(job: str, marker: Path) -> str:
    command = f"python -c \"import time; open('{marker}', 'a').write('run\\n'); time.sleep(3)\""
    return json.dumps({"name": job, "framework": "custom", "learners": 1, "command": command,
                       "resources": {"cpus": 0.25, "memory": "128Mi"}})


def _deploy(lcm: GrpcLcm, job: str, marker: Path) -> list[str]:
    """As the dispatcher does: an LCM that is down or between leaders is asked again."""
    def call() -> list[str]:
        return lcm.deploy_job(job, "team-a", 1, _manifest(job, marker), "")

    return wait_for(lambda: _or_none(call), 60, f"the LCM to deploy {job}", interval=0.2)


def _refused(lcm: GrpcLcm, job: str, marker: Path) -> str:
    """A deploy resent after its KillJob: the Conflict's message ("served" if it was deployed)."""
    def call() -> str | None:
        try:
            lcm.deploy_job(job, "team-a", 1, _manifest(job, marker), "")
        except Conflict as e:
            return e.message
        except Unavailable:
            return None
        return "served"

    return wait_for(call, 60, f"the LCM to answer the deploy of {job}", interval=0.2)


def _controllers(handles: list[str]) -> set[str]:
    """The "controller-<rank>:<pid>" handles: a learner started again comes with a new controller."""
    return {h for h in handles if h.startswith("controller-")}


def _or_none(fn):  # noqa: ANN001, ANN202
    try:
        return fn()
    except Unavailable:
        return None


@pytest.mark.parametrize("ended_during_takeover", [False, True], ids=["running", "ended-during-takeover"])
def test_the_lcm_leader_sigkilled_between_deploys_loses_and_repeats_nothing(store_settings, tmp_path, unique,
                                                                           ended_during_takeover):
    server, trainer = start_trainer(trainer_port := free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    env.update({"PYTHONPATH": os.getcwd(), "TF_STATE_DIR": str(store_settings.state_dir), "TF_DEV_MODE": "1",
                "TF_ETCD_ENDPOINTS": store_settings.etcd_endpoints, "TF_ETCD_PREFIX": store_settings.etcd_prefix,
                "TF_MONGO_URL": store_settings.mongo_url, "TF_MONGO_DB": store_settings.mongo_db,
                "TF_LOGSTORE_URL": store_settings.logstore_url, "TF_LOGSTORE_INDEX": store_settings.logstore_index,
                "TF_OBJECTSTORE_URL": store_settings.objectstore_url, "TF_PYTHON": sys.executable,
                "TF_TRAINER_ADDRESS": f"127.0.0.1:{trainer_port}", "TF_LOCAL_GPUS": "0", "TF_LEASE_TTL": "3",
                "TF_ISOLATION": "none", "TF_ELECT": "1", "TF_LEADER_TTL": str(LEASE)})
    ports = [free_port(), free_port()]
    procs: list[subprocess.Popen] = []

    def start(port: int) -> subprocess.Popen:
        with (tmp_path / f"lcm-{len(procs)}.log").open("wb") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "trainforge_services.lcm"],
                                          env={**env, "TF_LISTEN_ADDRESS": f"127.0.0.1:{port}"}, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        return procs[-1]

    for port in ports:
        start(port)
    coordinator = Coordinator(store_settings.etcd_endpoints, store_settings.etcd_prefix)
    lcm = GrpcLcm(",".join(f"127.0.0.1:{p}" for p in ports), timeout=30,
                  authorization=rpcauth.service_authorization(store_settings))
    jobs = [f"rep{i}-{unique}" for i in range(4)]

    def ended(job: str) -> bool:
        return any(r.job_id == job and JobState(r.state) == JobState.COMPLETED for r in list(trainer.reports))

    markers = {job: tmp_path / f"{job}.runs" for job in jobs}
    try:
        key = coordinator.keys.leader("lcm")
        holder = wait_for(lambda: (coordinator.get(key)[0] or {}).get("holder"), 60, "an LCM to be elected")
        leader = procs[ports.index(int(holder.rsplit(":", 1)[1]))]
        controllers = {job: _controllers(_deploy(lcm, job, markers[job])) for job in jobs[:2]}
        wait_for(lambda: all(m.exists() for m in (markers[j] for j in jobs[:2])), 60, "the first learners to run")

        follower = procs[1 - procs.index(leader)]
        if ended_during_takeover:
            follower.send_signal(signal.SIGSTOP)  # it cannot take over before the attempts ended
        leader.send_signal(signal.SIGKILL)
        if ended_during_takeover:
            wait_for(lambda: all(ended(j) for j in jobs[:2]), 60, "the first jobs to complete")
            follower.send_signal(signal.SIGCONT)
        killed = time.monotonic()
        wait_for(lambda: (coordinator.get(key)[0] or {}).get("holder") not in (None, holder), 30, "a new leader")
        takeover = time.monotonic() - killed
        # the dispatcher resends a deploy whose answer it lost
        assert _controllers(_deploy(lcm, jobs[0], markers[jobs[0]])) == controllers[jobs[0]], "a second controller"
        for job in jobs[2:]:
            controllers[job] = _controllers(_deploy(lcm, job, markers[job]))

        wait_for(lambda: all(ended(j) for j in jobs), 120, "every job to complete")
        for job in jobs:  # resent once more, after the attempt ended: nothing starts again
            assert _controllers(_deploy(lcm, job, markers[job])) == controllers[job], f"{job}: a second controller"
        for job in jobs:
            assert markers[job].read_text() == "run\n", f"{job}'s learner ran {markers[job].read_text().count('run')} times"
            ends = [r for r in list(trainer.reports) if r.job_id == job and JobState(r.state) == JobState.COMPLETED]
            assert len(ends) == 1, f"{job} completed {len(ends)} times"
        assert takeover < LEASE + 2, f"the follower took over {takeover:.1f}s after the SIGKILL"
        for job in jobs:
            lcm.kill_job(job, "test over")
        # a deploy still in flight through the KillJob (its answer lost, resent) is refused and starts nothing
        for job in jobs:
            assert _refused(lcm, job, markers[job]).startswith(f"job {job} attempt 1 was killed")
        # also once the leader that killed them is gone and a replica started afresh leads (a restarted LCM)
        holder = coordinator.get(key)[0]["holder"]
        procs[ports.index(int(holder.rsplit(":", 1)[1]))].send_signal(signal.SIGKILL)
        start(int(holder.rsplit(":", 1)[1]))
        wait_for(lambda: (coordinator.get(key)[0] or {}).get("holder") not in (None, holder), 30, "a new leader")
        for job in jobs:
            assert _refused(lcm, job, markers[job]).startswith(f"job {job} attempt 1 was killed")
            assert markers[job].read_text() == "run\n", f"{job}'s learner ran again after its KillJob"
    finally:
        lcm.close()
        coordinator.close()
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)  # a follower the test stopped
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(15)
        for job in jobs:  # what a failed run left (monitors and controllers outlive the LCMs by design)
            for leftover in job_processes(Path(store_settings.state_dir) / "work" / job, job):
                with contextlib.suppress(psutil.Error):
                    leftover.kill()
        server.stop(0).wait()

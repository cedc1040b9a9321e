"""Two Trainer processes, one elected dispatcher: SIGKILL (or pause) the leader during a burst of submits.

Real etcd and MongoDB-wire servers; the Trainers are `python -m services.
trainer` processes with TF_ELECT=1 and a 2 s leader lease, reached through
one channel listing both (round-robin over the live one). The LCM is the
in-process fake of test_trainer_service; the test plays the job monitor,
reporting RUNNING, STORING and COMPLETED for every attempt the LCM was asked to
deploy. Checked: every job completes, each was reserved exactly once (one
QUEUED -> DEPLOYING in its history, one attempt deployed), the jobs active
at once never exceed the LCM's capacity (no two leaders spent the same
capacity), and the follower took over within about one lease TTL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from tests.chaos_support import check_history
from tests.integration.test_quota_admission import manifest, running_fake_lcm
from tests.servers import free_port, wait_for
from trainforge_protos import trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import rpc, rpcauth
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.states import JobState
from trainforge_services.trainer.store import JobStore

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]

JOBS = 200
CAPACITY = 16  # CPUs of the fake LCM; every job needs 1
LEASE = 2


def _spawn_trainer(env: dict[str, str], port: int, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "trainforge_services.trainer"],
                                env={**env, "TF_LISTEN_ADDRESS": f"127.0.0.1:{port}"},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@contextlib.contextmanager
def trainer_replicas(etcd_server, mongo_server, osmem_server, unique: str, tmp_path: Path,
                     lcm_address: str) -> Iterator[tuple[list[subprocess.Popen], list[int]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    env.update({"PYTHONPATH": os.getcwd(), "TF_STATE_DIR": str(tmp_path), "TF_DEV_MODE": "1",
                "TF_MONGO_URL": mongo_server.url, "TF_MONGO_DB": f"tf{unique}",
                "TF_ETCD_ENDPOINTS": etcd_server.address, "TF_ETCD_PREFIX": f"/tf-{unique}",
                "TF_LOGSTORE_URL": osmem_server.url, "TF_LCM_ADDRESS": lcm_address,
                "TF_SECRETS_KEY": Fernet.generate_key().decode(), "TF_ELECT": "1",
                "TF_LEADER_TTL": str(LEASE), "TF_DISPATCH_INTERVAL": "0.2"})
    ports = [free_port(), free_port()]
    procs = [_spawn_trainer(env, port, tmp_path / f"trainer-{i}.log") for i, port in enumerate(ports)]
    try:
        yield procs, ports
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def _retried(fn, *args, deadline: float = 60.0):  # noqa: ANN001, ANN202
    """Call through the replicas' channel until a live one answers (the dead one is being dropped)."""
    end = time.monotonic() + deadline
    while True:
        try:
            return rpc.call(fn, *args, timeout=10)
        except Unavailable:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def _max_overlap(jobs: list) -> int:  # noqa: ANN001 - JobRecords
    """The most jobs in the ACTIVE states at one instant, from their histories."""
    edges = []
    for job in jobs:
        for e in job.history:
            if e.to_state == JobState.DEPLOYING:
                edges.append((e.ts, 1))
            elif e.from_state in (JobState.DEPLOYING, JobState.RUNNING, JobState.STORING) and \
                    e.to_state not in (JobState.RUNNING, JobState.STORING):
                edges.append((e.ts, -1))
    most = now = 0
    for _, step in sorted(edges, key=lambda x: (x[0], x[1])):
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "paused"])
def test_the_trainer_leader_stopped_mid_burst_loses_and_duplicates_nothing(
        etcd_server, mongo_server, osmem_server, mongo_db, unique, tmp_path, how):
    """SIGSTOP: the leader is paused past its lease and resumed once a follower leads; it wakes up still
    thinking it leads until its next lease refresh, and the fence keeps whatever pass it runs meanwhile
    from reserving anything."""
    coordinator = Coordinator(etcd_server.address, prefix=f"/tf-{unique}")
    leader_key = coordinator.keys.leader("trainer")
    with contextlib.closing(coordinator), running_fake_lcm(cpus=CAPACITY, gpus=0) as lcm, \
            trainer_replicas(etcd_server, mongo_server, osmem_server, unique, tmp_path, lcm.address) as (procs, ports):
        token = rpcauth.load_service_token("", dev_mode=True, state_dir=tmp_path)  # the replicas' (dev mode)
        channel = rpc.channel(",".join(f"127.0.0.1:{p}" for p in ports), authorization=f"Bearer {token}")
        stub = trainer_pb2_grpc.TrainerStub(channel)
        wait_for(lambda: coordinator.get(leader_key)[0], 60, "a Trainer to be elected")
        wait_for(lambda: _healthy(stub), 60, "the Trainers to serve")
        leader_port = int(coordinator.get(leader_key)[0]["holder"].rsplit(":", 1)[1])
        leader = procs[ports.index(leader_port)]

        stop = threading.Event()
        reported: set[tuple[str, int]] = set()

        def monitor() -> None:  # completes each deployed attempt, as a job monitor would
            while not stop.is_set():
                for d in list(lcm.deploys):
                    if (d.job_id, d.attempt) in reported:
                        continue
                    for state in (JobState.RUNNING, JobState.STORING, JobState.COMPLETED):
                        _retried(stub.ReportJobStatus, trainer_pb2.ReportJobStatusRequest(
                            job_id=d.job_id, attempt=d.attempt, state=state, reason=state.name.lower(),
                            actor="monitor"))
                    reported.add((d.job_id, d.attempt))
                stop.wait(0.05)

        reporter = threading.Thread(target=monitor, daemon=True)
        reporter.start()
        ids = [f"burst-{i:03d}" for i in range(JOBS)]
        killed_at, took = 0.0, []

        def successor() -> None:
            holder = wait_for(lambda: (v := coordinator.get(leader_key)[0]) and
                              int(v["holder"].rsplit(":", 1)[1]) != leader_port and v["holder"], 30, "a new leader")
            took.append((time.monotonic() - killed_at, holder))
            if how == signal.SIGSTOP:
                leader.send_signal(signal.SIGCONT)

        started = time.monotonic()
        for i, job_id in enumerate(ids):
            if i == JOBS // 3:
                leader.send_signal(how)
                killed_at = time.monotonic()
                threading.Thread(target=successor, daemon=True).start()
            _retried(stub.SubmitJob, trainer_pb2.SubmitJobRequest(
                team=f"team-{i % 3}", manifest_json=manifest(job_id), job_id=job_id, idempotency_key=job_id,
                submitted_by="key-1"))
        wait_for(lambda: took, 30, "a new leader")
        store = JobStore(mongo_db)

        def all_completed() -> bool:
            return all(j.state == JobState.COMPLETED for j in store.in_states(list(JobState)[1:], ["state"])) \
                and len(store.in_states([JobState.COMPLETED], ["state"])) == JOBS

        wait_for(all_completed, 240, f"{JOBS} jobs to complete")
        elapsed = time.monotonic() - started
        stop.set()
        reporter.join(10)
        channel.close()

    jobs = [store.find(job_id) for job_id in ids]
    assert all(j is not None and j.state == JobState.COMPLETED for j in jobs)
    for job in jobs:
        check_history(_as_rest(job))
        reservations = [e for e in job.history if e.to_state == JobState.DEPLOYING]
        assert len(reservations) == 1, f"{job.id} reserved {len(reservations)} times: {job.history}"
        assert job.attempt == 1
    deployed = {(d.job_id, d.attempt) for d in lcm.deploys}
    assert deployed == {(job_id, 1) for job_id in ids}
    assert _max_overlap(jobs) <= CAPACITY
    takeover, holder = took[0]
    assert takeover < LEASE + 2, f"the follower took over {takeover:.1f}s after the leader's {how.name}"
    if how == signal.SIGSTOP:
        log = (tmp_path / f"trainer-{procs.index(leader)}.log").read_text()
        assert "is no longer the leader" in log, "the resumed leader never noticed it was deposed"
    print(f"{JOBS} jobs in {elapsed:.1f}s; new leader {holder} {takeover:.1f}s after the {how.name}; "
          f"{len(lcm.deploys)} DeployJob calls for {len(deployed)} attempts")


def _as_rest(job) -> dict:  # noqa: ANN001 - a JobRecord, in the REST shape the chaos checks read
    return {"id": job.id, "state": job.state.name.lower(), "reason": job.reason, "attempt": job.attempt,
            "history": [{"from": e.from_state.name.lower(), "to": e.to_state.name.lower(), "timestamp": e.ts}
                        for e in job.history]}


def _healthy(stub: trainer_pb2_grpc.TrainerStub) -> bool:
    try:
        return bool(rpc.call(stub.Health, trainer_pb2.HealthRequest(), timeout=2))
    except Unavailable:
        return False

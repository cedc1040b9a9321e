"""`python -m trainforge_services.jobmonitor` as a process against real etcd and a fake Trainer gRPC server.

The real reporter, the settings and the retry while the Trainer is
unreachable are exercised here; the monitor's logic is in test_monitor_flow.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import grpc
import psutil

from tests.integration.conftest import monitor_claimed, put
from tests.servers import free_port, wait_for
from trainforge_protos import common_pb2, trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import niceness, rpc
from trainforge_services.common.states import JobState, LearnerState

L = LearnerState




class FakeTrainer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self):
        self.reports: list[trainer_pb2.ReportJobStatusRequest] = []

    def ReportJobStatus(self, request, context):  # noqa: ANN001
        self.reports.append(request)
        return common_pb2.Job(id=request.job_id, state=request.state)


def start_trainer(port: int) -> tuple[grpc.Server, FakeTrainer]:
    trainer = FakeTrainer()
    server, _ = rpc.make_server(f"127.0.0.1:{port}", max_workers=2)
    trainer_pb2_grpc.add_TrainerServicer_to_server(trainer, server)
    server.start()
    return server, trainer


def spawn_monitor(tmp_path, coordinator, etcd_server, job: str, trainer_port: int, **settings: str
                  ) -> subprocess.Popen:
    spec = tmp_path / "monitor.json"
    spec.write_text(json.dumps({"job_id": job, "team": "team-a", "attempt": 1, "learners": 2,
                                "start_timeout": 60}))
    env = {**os.environ, "TF_ETCD_ENDPOINTS": etcd_server.address, "TF_ETCD_PREFIX": coordinator.keys.prefix,
           "TF_TRAINER_ADDRESS": f"127.0.0.1:{trainer_port}", "TF_REPORT_RETRY_SECONDS": "0.1", **settings}
    log = (tmp_path / "monitor.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "trainforge_services.jobmonitor", "--spec", str(spec)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return proc


def test_the_monitor_process_retries_until_the_trainer_is_up(tmp_path, coordinator, etcd_server, job):
    port = free_port()
    proc = spawn_monitor(tmp_path, coordinator, etcd_server, job, port)
    server = None
    try:
        wait_for(lambda: monitor_claimed(coordinator, job), 20, "the monitor process to claim the job")
        put(coordinator, job, 0, L.LEARNER_COMPLETED, exit_code=0)
        put(coordinator, job, 1, L.LEARNER_COMPLETED, exit_code=0)
        log = tmp_path / "monitor.log"
        wait_for(lambda: "retrying" in log.read_text(), 20, "a failed report to be retried")
        server, trainer = start_trainer(port)
        assert proc.wait(30) == 0
        assert [JobState(r.state) for r in trainer.reports] == [JobState.RUNNING, JobState.STORING,
                                                                  JobState.COMPLETED]
        assert trainer.reports[-1].outputs_uri == f"store://jobs/{job}/outputs/"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if server is not None:
            server.stop(0).wait()


def test_the_monitor_process_stops_on_sigterm_and_releases_the_job(tmp_path, coordinator, etcd_server, job):
    server, trainer = start_trainer(port := free_port())
    proc = spawn_monitor(tmp_path, coordinator, etcd_server, job, port)
    try:
        wait_for(lambda: monitor_claimed(coordinator, job), 20, "the monitor process to claim the job")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert not monitor_claimed(coordinator, job)
        assert trainer.reports == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop(0).wait()


def test_the_monitor_process_runs_at_tf_job_nice(tmp_path, coordinator, etcd_server, job):
    """The local backend's TF_JOB_NICE: the monitor lowers itself, its threads and its session's autogroup."""
    server, _ = start_trainer(port := free_port())
    proc = spawn_monitor(tmp_path, coordinator, etcd_server, job, port, TF_JOB_NICE="10")
    try:
        wait_for(lambda: monitor_claimed(coordinator, job), 20, "the monitor process to claim the job")
        monitor = psutil.Process(proc.pid)
        threads = [t.id for t in monitor.threads()]
        assert len(threads) > 1  # its etcd and gRPC threads, started after it lowered itself
        assert [os.getpriority(os.PRIO_PROCESS, tid) for tid in threads] == [10] * len(threads)
        assert niceness.autogroup_nice(proc.pid) in (10, None)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert "control plane's priority" not in (tmp_path / "monitor.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop(0).wait()


def test_the_monitor_process_claims_the_job_for_tf_lease_ttl(tmp_path, coordinator, etcd_server, job):
    """The LCM's TF_LEASE_TTL sets the monitor's claim lease: a killed monitor's claim ends within it."""
    server, _ = start_trainer(port := free_port())
    proc = spawn_monitor(tmp_path, coordinator, etcd_server, job, port, TF_LEASE_TTL="2")
    try:
        wait_for(lambda: monitor_claimed(coordinator, job), 20, "the monitor process to claim the job")
        proc.kill()
        proc.wait()
        # the default lease (10 s) would hold the claim well past this deadline
        wait_for(lambda: not monitor_claimed(coordinator, job), 6, "the killed monitor's 2 s claim to expire")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop(0).wait()


def test_the_monitor_process_rejects_a_bad_spec(tmp_path):
    spec = tmp_path / "monitor.json"
    spec.write_text(json.dumps({"job_id": "j", "attempt": 1, "learners": 0}))
    done = subprocess.run([sys.executable, "-m", "trainforge_services.jobmonitor", "--spec", str(spec)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "learners" in done.stderr

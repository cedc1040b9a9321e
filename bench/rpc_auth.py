"""What checking every caller costs the Trainer per call: the same RPCs with and without the check.

Starts a MongoDB-wire server and a real Trainer (an LCM that runs nothing),
submits one job and reports it RUNNING, then serves the Trainer's servicer
twice: on the Trainer's own port (every call checked, common/rpcauth.py) and
on a second server without the check, sharing the same job service. It
alternates R rounds of N calls on each, one call at a time:
- GetJob and Health with the service token, and without any on the
  unchecked server;
- ReportJobStatus (a repeated RUNNING report, which changes nothing) with the
  job monitor's own token, with the service token, and without any.
Prints the machine line and, per call, the median (min-max) over rounds of the
mean microseconds per call: wall time, and the CPU time of this process (client
and server together, steadier on a loaded machine), each with its difference
to the unchecked server. Then the check alone: `ServerAuth` called directly,
N times, with each kind of caller. Usage:

    PYTHONPATH=$PWD .venv/bin/python bench/rpc_auth.py [-n 2000] [-r 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import grpc
from _stack import machine_line, spread

from tests import servers
from tests.fakes.lcm import IdleLcm
from trainforge_protos import trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import jobcreds, rpc, rpcauth
from trainforge_services.common.settings import TrainerSettings
from trainforge_services.common.states import JobState
from trainforge_services.trainer import wiring
from trainforge_services.trainer.grpc_api import TrainerServicer
from trainforge_services.trainer.resources import Usage
from trainforge_services.trainer.wiring import serve

JOB = "j-0123456789ab"
REPORT = "/trainforge.v1.Trainer/ReportJobStatus"


def per_call_us(method, request, n: int) -> tuple[float, float]:  # noqa: ANN001 - a stub method
    """Mean wall and CPU microseconds per call."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        rpc.call(method, request)
    return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6


def check_alone_us(auth: rpcauth.ServerAuth, metadata: list[tuple[str, str]], n: int) -> float:
    """Mean CPU microseconds of one `ServerAuth.intercept_service` (the handler lookup it wraps is a dict get)."""
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: None)
    details = SimpleNamespace(method=REPORT, invocation_metadata=tuple(metadata))
    cpu = time.process_time()
    for _ in range(n):
        auth.intercept_service(lambda _: handler, details)
    return (time.process_time() - cpu) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=2000, help="calls per round and kind")
    ap.add_argument("-r", "--rounds", type=int, default=5, help="rounds, alternating checked and unchecked")
    args = ap.parse_args()
    mongo = servers.start_mongo()
    state = Path(tempfile.mkdtemp(prefix="tf-bench-auth-"))
    settings = TrainerSettings(state_dir=state, dev_mode=True, mongo_url=mongo.url, mongo_db="bench",
                               trainer_address="127.0.0.1:0", dispatch_interval=0.2)
    trainer = serve(settings, lcm=IdleLcm(Usage(0, 64, 2**40, 64)))
    plain, port = rpc.make_server("127.0.0.1:0", max_workers=16)
    trainer_pb2_grpc.add_TrainerServicer_to_server(TrainerServicer(trainer.service), plain)
    plain.start()
    key = jobcreds.load_key("", dev_mode=True, state_dir=state)
    monitor = rpcauth.job_authorization(jobcreds.MONITOR, JOB, jobcreds.derive(key, jobcreds.MONITOR, JOB))
    channels = {"service token": rpc.channel(trainer.address, authorization=rpcauth.service_authorization(settings)),
                "monitor token": rpc.channel(trainer.address, authorization=monitor),
                "unchecked": rpc.channel(f"127.0.0.1:{port}")}
    stubs = {name: trainer_pb2_grpc.TrainerStub(ch) for name, ch in channels.items()}
    try:
        manifest = json.dumps({"name": "bench", "command": "true", "resources": {"cpus": 1, "memory": "1Gi"}})
        rpc.call(stubs["service token"].SubmitJob, trainer_pb2.SubmitJobRequest(
            team="t", manifest_json=manifest, job_id=JOB, code_uri=f"store://jobs/{JOB}/code.tar.gz"))
        servers.wait_for(lambda: rpc.call(stubs["service token"].GetJob, trainer_pb2.GetJobRequest(
            team="t", job_id=JOB)).state == JobState.DEPLOYING, 30, "the job to be deployed")
        report = trainer_pb2.ReportJobStatusRequest(job_id=JOB, attempt=1, state=JobState.RUNNING, actor="monitor",
                                                    reason="running")
        rpc.call(stubs["monitor token"].ReportJobStatus, report)
        cases = [("GetJob", trainer_pb2.GetJobRequest(team="t", job_id=JOB), ("service token", "unchecked")),
                 ("Health", trainer_pb2.HealthRequest(), ("service token", "unchecked")),
                 ("ReportJobStatus", report, ("monitor token", "service token", "unchecked"))]
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for method, request, callers in cases:
                for who in callers:
                    stub_method = getattr(stubs[who], method)
                    per_call_us(stub_method, request, 50)  # warm
                    results.setdefault((method, who), []).append(per_call_us(stub_method, request, args.n))
        print(machine_line())
        print(f"{args.rounds} rounds of {args.n} sequential calls each; mean us per call, median (min-max) of rounds")
        for method, _, callers in cases:
            for who in callers:
                line = f"{method:<16} {who:<14}"
                for i, kind in enumerate(("wall", "cpu")):
                    values = [r[i] for r in results[(method, who)]]
                    base = statistics.median(r[i] for r in results[(method, "unchecked")])
                    diff = "" if who == "unchecked" else f" ({statistics.median(values) - base:+.1f})"
                    line += f"  {kind} {spread(values)}{diff}"
                print(line)
        auth = wiring.server_auth(settings)
        for who, metadata in (("service token", [(rpcauth.METADATA, rpcauth.service_authorization(settings))]),
                              ("monitor token", [(rpcauth.METADATA, monitor)]), ("none", [])):
            cpu = [check_alone_us(auth, metadata, args.n * 10) for _ in range(args.rounds)]
            print(f"the check alone, {who:<14} cpu {spread(cpu)} us")
    finally:
        for ch in channels.values():
            ch.close()
        plain.stop(0)
        trainer.stop(grace=0)
        mongo.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

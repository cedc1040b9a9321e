"""Scale simulation: Q queued and R running jobs on the simulated backend, through the real Trainer, store and etcd.

A private embedded stack runs with TF_BACKEND=simulated (services/lcm/backends/
simulated.py: no process per job; each attempt "runs" for its SIM_SECONDS and
then reaches COMPLETED through the etcd status keys and ReportJobStatus). T
teams share one cohort, each with 1/T of the backend's CPUs as its quota, so
fair sharing and borrowing are in play. Jobs are submitted through the
Trainer's gRPC API (SubmitJob) from C threads, not through REST, round-robin
over the teams:

1. R holders (1 learner, 1 CPU, SIM_SECONDS 3600) fill the backend; the
   bench waits until all run;
2. Q queued jobs (SIM_SECONDS --seconds) are submitted: the submit rate;
3. the queue stays full for --window seconds (passes every second);
4. the holders are cancelled (CancelJob) and the queue drains: the time
   until every queued job COMPLETED.

It prints the admission pass p50/p99/max by queue length (from the
Trainer's `admission pass:` log lines), CPU seconds of the Trainer, LCM,
API, store and etcd per job, their resident memory before and after, the
spread of starts over the teams among the first R queued jobs started, and
outcomes (jobs not completed, jobs deployed twice). Usage:

    PYTHONPATH=$PWD .venv/bin/python bench/scale_sim.py [--queued 10000] [--running 1000] [--teams 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pymongo
from _stack import admission_passes, machine_line, pct, pids, stack

from trainforge_protos import trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import rpc, rpcauth
from trainforge_services.common.states import JobState
from trainforge_services.devstack import storesock

SERVICES = ("trainer", "lcm", "api", "mongo", "etcd")
HOLDER, QUEUED = "scale-sim-holder", "scale-sim-queued"  # submitted_by of the two kinds of job
RUNNING, COMPLETED, DEPLOYING = int(JobState.RUNNING), int(JobState.COMPLETED), int(JobState.DEPLOYING)
ENDED_BADLY = (int(JobState.FAILED), int(JobState.CANCELLED))


def manifest(seconds: float) -> str:
    return json.dumps({"name": "sim", "framework": "custom", "resources": {"cpus": 1, "memory": "64Mi"},
                       "command": "true", "env": {"SIM_SECONDS": f"{seconds:g}"}})


class Services:
    """CPU seconds and RSS of the stack's service processes."""

    def __init__(self, state):
        self.procs = {}
        for name in SERVICES:
            try:
                self.procs[name] = psutil.Process(pids(state, name)[0])
            except (OSError, psutil.Error):
                continue

    def sample(self) -> dict[str, tuple[float, float]]:
        out = {}
        for name, p in self.procs.items():
            t = p.cpu_times()
            out[name] = (t.user + t.system, p.memory_info().rss / 2**20)
        return out


def wait_count(jobs, query: dict, n: int, timeout: float, what: str) -> float:
    """Seconds until `n` jobs match `query` (polled once a second)."""
    t0 = time.monotonic()
    while (have := jobs.count_documents(query)) < n:
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}: {have} of {n}")
        time.sleep(1.0)
    return time.monotonic() - t0


def submit_all(stub, teams: list[str], n: int, body: str, threads: int, offset: int,
               tag: str) -> tuple[list[str], float]:
    ids: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        job = rpc.call(stub.SubmitJob, trainer_pb2.SubmitJobRequest(
            team=teams[(offset + i) % len(teams)], manifest_json=body, submitted_by=tag), 60)
        with lock:
            ids.append(job.id)

    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(n)))
    return ids, time.monotonic() - t0


def pass_line(label: str, passes: list[tuple[int, int, float, float]]) -> str:
    """Whole passes, and their decisions alone (before the reservations, which cost a store write each)."""
    if not passes:
        return f"admission pass, {label:<22} (no passes)"
    ms, dec = [p[2] for p in passes], [p[3] for p in passes]
    return (f"admission pass, {label:<22} p50 {pct(ms, 50):7.1f} p99 {pct(ms, 99):7.1f} max {max(ms):7.1f} ms; "
            f"decided p50 {pct(dec, 50):6.1f} p99 {pct(dec, 99):6.1f} max {max(dec):6.1f} ms  "
            f"({len(ms)} passes, {sum(p[1] for p in passes)} dispatched)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queued", type=int, default=10000, help="jobs queued behind the running ones")
    ap.add_argument("--running", type=int, default=1000, help="jobs running at once (the backend's learners)")
    ap.add_argument("--teams", type=int, default=30, help="teams (one cohort)")
    ap.add_argument("-c", "--threads", type=int, default=16, help="client threads submitting")
    ap.add_argument("--seconds", type=float, default=5.0, help="how long each queued job runs")
    ap.add_argument("--window", type=float, default=20.0, help="seconds the full queue is watched")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds each phase may take")
    ap.add_argument("--drain-timeout", type=float, default=0,
                    help="stop watching the drain after this many seconds and report how far it got (0: wait)")
    args = ap.parse_args()

    extra = {"TF_BACKEND": "simulated", "TF_SIM_MAX_LEARNERS": str(args.running),
             "TF_SIM_CPUS": str(args.running), "TF_RATE_LIMIT_PER_SECOND": "0"}
    with stack(extra) as st:
        ports = st.status()["ports"]
        token = rpcauth.load_service_token("", dev_mode=True, state_dir=st.state)  # the stack's (dev mode)
        channel = rpc.channel(f"127.0.0.1:{ports['trainer']}", authorization=f"Bearer {token}")
        stub = trainer_pb2_grpc.TrainerStub(channel)
        # the embedded stack's MongoDB listens on a unix socket in its state dir (devstack/storesock.py)
        jobs = pymongo.MongoClient(storesock.mongo_url(st.state / "mongo" / "mongo.sock"))["trainforge"]["jobs"]
        teams = [f"sim-{i:02d}" for i in range(args.teams)]
        share = -(-args.running // args.teams)
        for team in teams:
            rpc.call(stub.SetQuota, trainer_pb2.SetQuotaRequest(
                team=team, actor="scale-sim", quota=trainer_pb2.Quota(cpus=share, cohort="sim")))
        services = Services(st.state)
        s0 = services.sample()

        holders, hold_secs = submit_all(stub, teams, args.running, manifest(3600), args.threads, 0, HOLDER)
        fill = wait_count(jobs, {"state": RUNNING}, args.running, args.timeout, "the holders to run")
        s1 = services.sample()
        log_mark = st.log("trainer").stat().st_size
        queued, submit_secs = submit_all(stub, teams, args.queued, manifest(args.seconds), args.threads,
                                         args.running, QUEUED)
        s2 = services.sample()
        time.sleep(args.window)
        full_mark = st.log("trainer").stat().st_size

        t_drain = time.monotonic()
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(lambda j: rpc.call(stub.CancelJob, trainer_pb2.CancelJobRequest(
                team=jobs.find_one({"_id": j}, {"team": 1})["team"], job_id=j, actor="scale-sim"), 60), holders))
        completed = {"submitted_by": QUEUED, "state": COMPLETED}  # (an `$in` of 10,000 ids is slow here)
        if args.drain_timeout:
            while time.monotonic() - t_drain < args.drain_timeout and jobs.count_documents(completed) < len(queued):
                time.sleep(1.0)
        else:
            wait_count(jobs, completed, len(queued), args.timeout, "the queue to drain")
        drain = time.monotonic() - t_drain
        drained = jobs.count_documents(completed)
        s3 = services.sample()

        docs = list(jobs.find({"submitted_by": QUEUED}, {"team": 1, "state": 1, "history": 1}))
        channel.close()
        with st.log("trainer").open("rb") as f:
            f.seek(log_mark)
            during = f.read().decode(errors="replace")
        passes = admission_passes(during)
        full_at = full_mark - log_mark

    twice = [d["_id"] for d in docs if sum(h["to"] == DEPLOYING for h in d["history"].values()) > 1]
    lost = [d["_id"] for d in docs if d["state"] != COMPLETED and not args.drain_timeout]
    failed = [d["_id"] for d in docs if d["state"] in ENDED_BADLY]
    deployed = sorted((min(h["ts"] for h in d["history"].values() if h["to"] == DEPLOYING), d["team"])
                      for d in docs if any(h["to"] == DEPLOYING for h in d["history"].values()))
    first = [team for _, team in deployed[:args.running]]
    per_team = [first.count(t) for t in teams]

    print(machine_line())
    print(f"{args.queued} queued + {args.running} running jobs, {args.teams} teams in one cohort (quota "
          f"{share} CPUs each), simulated backend ({args.running} learners), submitted through the Trainer's "
          f"gRPC SubmitJob from {args.threads} threads")
    print(f"outcomes: {len(lost)} queued jobs not completed, {len(twice)} deployed twice, {len(failed)} failed "
          f"or cancelled")
    print(f"holders: {args.running} submitted in {hold_secs:.1f} s, all RUNNING after {fill:.1f} s more")
    print(f"submits/s (queued)        {len(queued) / submit_secs:9.1f}   ({submit_secs:.1f} s for {len(queued)})")
    print(f"time to drain             {drain:9.1f} s   ({drained} of {len(queued)} jobs of {args.seconds:g} s "
          f"completed, {args.running} at once; {drained / drain:.1f} completions/s)")
    top = max(p[0] for p in passes) if passes else 0
    print(pass_line(f"queue >= {int(0.9 * args.queued)}", [p for p in passes if p[0] >= 0.9 * args.queued]))
    for lo, hi in ((0.5, 0.9), (0.1, 0.5), (0.0, 0.1)):
        print(pass_line(f"queue {int(lo * args.queued)}-{int(hi * args.queued)}",
                        [p for p in passes if lo * args.queued <= p[0] < hi * args.queued and p[0] > 0]))
    print(f"  (most queued seen in a pass: {top}; log bytes at full queue: {full_at})")
    print(f"starts over teams among the first {len(first)} queued jobs deployed: min {min(per_team)}, "
          f"max {max(per_team)} (fair: {len(first) / args.teams:.1f} each)")
    n = args.running + args.queued
    for name in services.procs:
        cpu = s3[name][0] - s0[name][0]
        print(f"{name:<8} CPU {cpu:8.1f} s = {cpu / n * 1000:6.2f} ms per job   RSS {s0[name][1]:6.0f} -> "
              f"{s1[name][1]:6.0f} (running) -> {s2[name][1]:6.0f} (queued) -> {s3[name][1]:6.0f} MiB (drained)")
    return 1 if (lost or twice or failed) else 0


if __name__ == "__main__":
    sys.exit(main())

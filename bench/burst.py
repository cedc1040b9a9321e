"""N trivial jobs submitted at once to a private embedded stack: outcomes, rates, admission passes, memory.

Submits N one-learner jobs (`python -c "print(...)"`, 0.05 CPU each, so the
backend's capacity is not what bounds the rate) from C client threads, then
follows every job until it ends and prints:
- outcomes: jobs lost (not found, or not completed) and jobs run twice (more
  than one RUNNING or DEPLOYING in the job's status history, or attempt > 1);
- submits/s accepted (API answers), starts/s (RUNNING entries per second
  between the first and the last), seconds until all ended;
- the Trainer's admission pass with jobs queued, p50/p99, from the pass
  timing lines of its log (`admission pass: Q queued, ...`);
- resident memory of the stack's services, and of monitors + controllers +
  guards per running job, sampled every 0.5 s;
- baseline in the same run: the same command run bare (one at a time), and
  the sequential rate of the same submits (the first few jobs, alone);
- CPU per submit of the API, Trainer, LCM, store and this client over the
  submit phase, and how busy the machine's CPUs were meanwhile;
- a ceiling in the same run, after the burst: the stack's own store
  (nx-27017) inserting copies of one of the burst's job documents into a
  scratch collection from the same C threads (a submit's one insert, with no
  API, Trainer or audit entry around it), `--store-inserts` of them.

The API's rate limit is lifted for the run (TF_RATE_LIMIT_PER_SECOND=0) and the
local backend offers room for the burst (TF_LOCAL_CPUS=1000, TF_LOCAL_MAX_LEARNERS=
--max-learners). Usage:

    PYTHONPATH=$PWD .venv/bin/python bench/burst.py [-n 200] [-c 16]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pymongo
from _stack import (
    TERMINAL,
    admission_passes,
    machine_line,
    pct,
    pids,
    platform_procs,
    reservation_writes,
    stack,
)

from trainforge.sdk import Client
from trainforge_services.devstack import storesock

COMMAND = "python -c \"print('hello from a burst job')\""


class MemorySampler(threading.Thread):
    """Peak RSS of the stack's services, and per running job of its monitor/controllers/guards."""

    def __init__(self, state, services: list[int]):
        super().__init__(daemon=True)
        self.state, self.stop = state, threading.Event()
        self.services = [psutil.Process(pid) for pid in services]
        self.service_peak = 0.0
        self.per_job: list[float] = []
        self.service_samples: list[float] = []

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                svc = sum(p.memory_info().rss for p in self.services)
            except psutil.Error:
                continue
            self.service_peak = max(self.service_peak, svc)
            self.service_samples.append(svc)
            jobs: dict[str, float] = collections.defaultdict(float)
            for job, procs in platform_procs(self.state).items():
                for p in procs:
                    try:
                        jobs[job] += p.memory_info().rss
                    except psutil.Error:
                        continue
            if jobs:
                self.per_job.append(statistics.mean(jobs.values()))


def store_ceiling(st, job_ids: list[str], n: int, threads: int) -> float:  # noqa: ANN001
    """Inserts/s of copies of a burst job's document into a scratch collection of the stack's store."""
    client = pymongo.MongoClient(storesock.mongo_url(st.state / "mongo" / "mongo.sock"), maxPoolSize=threads)
    try:
        db = client["trainforge"]
        doc = db["jobs"].find_one({"_id": job_ids[0]})
        if doc is None:
            raise SystemExit(f"store ceiling: job {job_ids[0]} is not in the store's trainforge.jobs")
        scratch = db["bench_store_ceiling"]
        scratch.drop()

        def insert(i: int) -> None:
            scratch.insert_one({**doc, "_id": f"{doc['_id']}-{i}"})

        t0 = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(insert, range(n)))
        rate = n / (time.monotonic() - t0)
        scratch.drop()
        return rate
    finally:
        client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=200, help="jobs submitted at once")
    ap.add_argument("-c", type=int, default=16, help="client threads submitting")
    ap.add_argument("--max-learners", type=int, default=8, help="learners the local backend runs at once")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds the whole burst may take")
    ap.add_argument("--store-inserts", type=int, default=300,
                    help="job documents inserted straight into the store after the burst, for its raw rate (0: skip)")
    ap.add_argument("-e", action="append", default=[], metavar="TF_X=V", help="a stack setting, e.g. TF_FORK_SERVER=false")
    args = ap.parse_args()

    bare = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run(COMMAND, shell=True, check=True, stdout=subprocess.DEVNULL)  # noqa: S602 - fixed command
        bare.append(time.perf_counter() - t0)

    extra = {"TF_RATE_LIMIT_PER_SECOND": "0", "TF_LOCAL_CPUS": "1000",
             "TF_LOCAL_MAX_LEARNERS": str(args.max_learners)}
    extra.update(setting.split("=", 1) for setting in args.e)
    manifest = {"name": "burst", "framework": "custom", "resources": {"cpus": 0.05, "memory": "64Mi"},
                "command": COMMAND}
    with stack(extra) as st:
        clients = [Client(st.api_url, st.api_key) for _ in range(args.c)]
        sampler = MemorySampler(st.state, pids(st.state, "api", "trainer", "lcm"))
        sampler.start()
        accepted: list[float] = []
        ids: list[str] = []
        errors: list[str] = []
        lock = threading.Lock()

        def submit(i: int) -> None:
            try:
                job = clients[i % args.c].submit(manifest, idempotency_key=f"burst-{i}")
            except Exception as e:  # noqa: BLE001 - a refused submit is an outcome to print
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                return
            with lock:
                ids.append(job["id"])
                accepted.append(time.monotonic())

        # CPU of the services, the store and this client over the submit phase (per submit, below)
        # the store: the embedded MongoDB-wire server, served on its unix socket (devstack/storesock.py)
        phase = {name: psutil.Process(pid) for name, pid in
                 zip(("api", "trainer", "lcm", "store"), pids(st.state, "api", "trainer", "lcm", "mongo"), strict=True)}
        phase["client"] = psutil.Process()
        cpu0 = {name: sum(p.cpu_times()[:2]) for name, p in phase.items()}
        busy0 = psutil.cpu_times()
        t0 = time.monotonic()
        t0_wall = time.time()
        with ThreadPoolExecutor(args.c) as pool:
            list(pool.map(submit, range(args.n)))
        submit_secs = time.monotonic() - t0
        busy1 = psutil.cpu_times()
        submit_cpu = {name: (sum(p.cpu_times()[:2]) - cpu0[name]) * 1000 / max(1, args.n)
                      for name, p in phase.items()}
        machine_busy = sum(getattr(busy1, f) - getattr(busy0, f) for f in ("user", "nice", "system")) / submit_secs

        pending = set(ids)
        final: dict[str, dict] = {}
        reader = clients[0]
        deadline = time.monotonic() + args.timeout
        # one listing per round of the jobs that ended since the previous one (each job as the listing has it,
        # history included): reading every pending job each round (100 GETs per 0.2 s) took most of a core
        # from the stack, listing every ended job each round read the same ended jobs again and again, and
        # listing every changed job read each job at each of its steps (most of them during the submits)
        since = t0_wall - 60  # every job was submitted after t0_wall
        while pending and time.monotonic() < deadline:
            changed, since = reader.list_changed(since, state=sorted(TERMINAL), page_size=200)
            for job in changed:
                if job["id"] in pending and job["state"] in TERMINAL:
                    final[job["id"]] = job
                    pending.discard(job["id"])
            if pending:
                time.sleep(0.5)
        sampler.stop.set()
        sampler.join()
        for c in clients:
            c.close()
        trainer_log = st.log("trainer").read_text()
        passes = [p[:3] for p in admission_passes(trainer_log)]
        writes = reservation_writes(trainer_log)
        store_rate = store_ceiling(st, ids[:1], args.store_inserts, args.c) if ids and args.store_inserts else None

    running_at, lost, twice = [], [], []
    ended_at = []
    for job_id in ids:
        job = final.get(job_id)
        if job is None or job["state"] != "completed":
            lost.append(job_id)
            if job is None:
                continue
        tos = [h["to"] for h in job["history"]]
        if tos.count("running") > 1 or tos.count("deploying") > 1 or job.get("attempt", 1) > 1:
            twice.append(job_id)
        running_at += [h["timestamp"] for h in job["history"] if h["to"] == "running"][:1]
        ended_at += [h["timestamp"] for h in job["history"] if h["to"] in TERMINAL][:1]
    starts = sorted(running_at)
    start_rate = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 and starts[-1] > starts[0] else 0.0
    all_ended = (max(ended_at) - t0_wall) if ended_at else float("nan")
    queued_passes = [ms for q, _, ms in passes if q > 0]

    print(machine_line())
    print(f"{args.n} trivial one-learner jobs submitted at once from {args.c} threads; command: {COMMAND}")
    print(f"outcomes: {len(ids)} accepted, {len(errors)} refused, {len(lost)} lost (not completed), "
          f"{len(twice)} run twice, {len(pending)} still running at the deadline")
    for e in errors[:5]:
        print(f"  refused: {e}")
    for job_id in lost[:5]:
        job = final.get(job_id)
        print(f"  not completed: {job_id} {job['state'] if job else 'unknown'}: {job['reason'] if job else ''}")
    print(f"submits accepted/s        {len(ids) / submit_secs:9.1f}   ({submit_secs:.2f} s for {len(ids)})")
    print(f"starts/s (RUNNING)        {start_rate:9.2f}")
    print("CPU ms per submit over the submit phase: " + ", ".join(f"{k} {v:.1f}" for k, v in submit_cpu.items())
          + f"; the machine's CPUs busy {machine_busy:.2f} of {psutil.cpu_count()} (all processes, any user)")
    if store_rate is not None:
        print(f"store ceiling: raw insert_one of a job document, {args.c} threads {store_rate:9.1f} /s   "
              f"(submits/s accepted / it: {len(ids) / submit_secs / store_rate:.2f})")
    print(f"time until all ended      {all_ended:9.1f} s   (bare command x N in sequence: "
          f"{statistics.median(bare) * args.n:.1f} s; ratio {all_ended / (statistics.median(bare) * args.n):.2f})")
    if queued_passes:
        print(f"admission pass, queue > 0 p50 {pct(queued_passes, 50):.1f} ms  p99 {pct(queued_passes, 99):.1f} ms  "
              f"({len(queued_passes)} passes, most queued {max(q for q, _, _ in passes)})")
    else:
        print("admission pass: no timing lines in the Trainer's log")
    if writes:
        after = [a for _, _, a in writes]
        print(f"reservations written after their pass decided p50 {pct(after, 50):.1f} ms  p99 {pct(after, 99):.1f} ms  "
              f"({sum(n for n, _, _ in writes)} in {len(writes)} batches, by the Trainer's writer thread)")
    print(f"service RSS (api+trainer+lcm) peak {sampler.service_peak / 2**20:.0f} MiB, first "
          f"{(sampler.service_samples or [0])[0] / 2**20:.0f} MiB, last {(sampler.service_samples or [0])[-1] / 2**20:.0f} MiB")
    if sampler.per_job:
        print(f"RSS per running job (monitor + controller + guard) median {statistics.median(sampler.per_job) / 2**20:.0f}"
              f" MiB, max {max(sampler.per_job) / 2**20:.0f} MiB")
    return 1 if (lost or twice or errors or pending) else 0


if __name__ == "__main__":
    sys.exit(main())

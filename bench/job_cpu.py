"""CPU per trivial job, by role: where the platform spends the CPU a burst of N trivial jobs costs.

Starts a private embedded stack (as `bench/burst.py` does: rate limit lifted,
room for the burst), submits N trivial one-learner jobs at once from C
threads, waits until every job ended and its processes are gone, and prints
"CPU ms per job" for each long-lived process of the stack (API, Trainer, LCM,
the warm fork server, the Mongo-wire store, etcd, the log store), read from
/proc/<pid>/stat (user + system) before and after. The job processes are the
fork server's children: their CPU (and that of everything they waited for:
learners, sandbox entries) is the fork server's "children" figure once it
reaped them. When the fork server is off, or a child was spawned instead,
that CPU lands in the LCM's children figure.

The client's own CPU is printed too; it follows the jobs with one listing of
the jobs that ended since its previous listing every 0.5 s (`list_changed`
with the end states: the jobs that ended, not every ended job again). Usage:

    PYTHONPATH=$PWD .venv/bin/python bench/job_cpu.py [-n 100] [-c 16] [--max-learners 8]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
from _stack import TERMINAL, machine_line, platform_procs, stack

from trainforge.sdk import Client

COMMAND = "python -c \"print('hello from a trivial job')\""
FORK_SERVER = "trainforge_services.common.forkserver"


def cpu(p: psutil.Process) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a process."""
    t = p.cpu_times()
    return t.user + t.system, t.children_user + t.children_system


def roles(state) -> dict[str, psutil.Process]:  # noqa: ANN001
    """The stack's long-lived processes by name: its pid files and the LCM's fork server."""
    found = {}
    for pid_file in sorted((state / "pids").glob("*.pid")):
        found[pid_file.stem] = psutil.Process(int(pid_file.read_text().split()[0]))
    for p in psutil.process_iter(["cmdline"]):
        if FORK_SERVER in (p.info["cmdline"] or []) and str(state) in " ".join(p.info["cmdline"] or []):
            found["fork server"] = p
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100, help="jobs submitted at once")
    ap.add_argument("-c", type=int, default=16, help="client threads submitting")
    ap.add_argument("--max-learners", type=int, default=8, help="learners the local backend runs at once")
    ap.add_argument("--timeout", type=float, default=900, help="seconds the whole burst may take")
    ap.add_argument("-e", action="append", default=[], metavar="TF_X=V", help="a stack setting, e.g. TF_FORK_SERVER=false")
    args = ap.parse_args()

    extra = {"TF_RATE_LIMIT_PER_SECOND": "0", "TF_LOCAL_CPUS": "1000",
             "TF_LOCAL_MAX_LEARNERS": str(args.max_learners)}
    extra.update(kv.split("=", 1) for kv in args.e)
    manifest = {"name": "cpu", "framework": "custom", "resources": {"cpus": 0.05, "memory": "64Mi"},
                "command": COMMAND}
    with stack(extra) as st:
        clients = [Client(st.api_url, st.api_key) for _ in range(args.c)]
        # one job first, so every service is past its first-use costs (imports, indexes, connections)
        first = clients[0].submit(manifest)
        while clients[0].get(first["id"])["state"] not in TERMINAL:
            time.sleep(0.2)
        while platform_procs(st.state):
            time.sleep(0.2)
        procs = roles(st.state)
        me = psutil.Process()
        before = {name: cpu(p) for name, p in procs.items()}
        mine0 = cpu(me)[0]
        busy0, t0, t0_wall = psutil.cpu_times(), time.monotonic(), time.time()
        ids: list[str] = []
        lock = threading.Lock()

        def submit(i: int) -> None:
            job = clients[i % args.c].submit(manifest, idempotency_key=f"cpu-{i}")
            with lock:
                ids.append(job["id"])

        with ThreadPoolExecutor(args.c) as pool:
            list(pool.map(submit, range(args.n)))
        pending, states = set(ids), {}
        deadline = time.monotonic() + args.timeout
        # every job was submitted after t0_wall; then each round lists only what changed since the last
        since = t0_wall - 60
        while pending and time.monotonic() < deadline:
            changed, since = clients[0].list_changed(since, state=sorted(TERMINAL), page_size=200)
            for j in changed:
                if j["id"] in pending and j["state"] in TERMINAL:
                    states[j["id"]] = j["state"]
                    pending.discard(j["id"])
            if pending:
                time.sleep(0.5)
        # the cleanup (KillJob) runs after the final state: wait until the jobs' processes are gone and reaped
        while platform_procs(st.state) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # the fork server reaps at least twice a second
        secs = time.monotonic() - t0
        busy1 = psutil.cpu_times()
        after = {name: cpu(p) for name, p in procs.items()}
        mine = cpu(me)[0] - mine0
        for c in clients:
            c.close()

    completed = sum(1 for s in states.values() if s == "completed")
    print(machine_line())
    print(f"{args.n} trivial one-learner jobs at once from {args.c} threads ({COMMAND}): {completed} completed, "
          f"{len(pending)} not ended, all ended and cleaned up after {secs:.1f} s")
    print(f"{'role':<22}{'own ms/job':>12}{'children ms/job':>17}")
    total = 0.0
    for name in procs:
        own = (after[name][0] - before[name][0]) * 1000 / args.n
        kids = (after[name][1] - before[name][1]) * 1000 / args.n
        total += own + kids
        print(f"{name:<22}{own:12.1f}{kids:17.1f}")
    print(f"{'total (stack)':<22}{total:12.1f}")
    print(f"{'bench client':<22}{mine * 1000 / args.n:12.1f}")
    busy = sum(getattr(busy1, f) - getattr(busy0, f) for f in ("user", "nice", "system"))
    print(f"the machine's CPUs: {busy * 1000 / args.n:.1f} ms per job busy (all processes, any user), "
          f"{busy / secs:.2f} of {psutil.cpu_count()} cores")
    return 0 if completed == args.n else 1


if __name__ == "__main__":
    sys.exit(main())

"""Log throughput: shipping against the log store's raw `_bulk`, learner slowdown, reading back.

Starts a private osmem-server (tests.servers.start_osmem) and measures, in
alternating runs (order flipped each round), medians and spreads (min-max):

  ship   : `LogShipper` tailing a finished N-line archive into the log store
           (its real batching, `write_raw`), lines/s
  bulk   : the same N documents sent straight to `_bulk` in batches of the
           same size with the same client, no archive, no shipper, lines/s
  learner: a Python learner printing N lines of ~90 bytes, wall seconds from
           start to exit, under the controller's `LearnerProcess` (pipes ->
           `LogArchive`, shipper running) against the same script with its
           output to /dev/null; and "pipes only": the controller's pipes,
           spool and archive without a shipper or log store, which tells
           the pipe path's cost from the CPU the log store's ingest takes;
           "offloaded" is the controller with TF_PLACE_CPUS=output
           (services/controller/priority.py; the default): the pipe readers, splitters,
           shipper and, for that run, the log store's threads kept off the
           last CPU; "placed" (TF_PLACE_CPUS=all) pins the learner to the
           last CPU too; the other variants run unplaced. Each learner run
           reports wall seconds and the CPU seconds of the learner's own
           processes (user + system, from the reaped children's rusage):
           the CPU figure moves little with other load on the machine and
           shows what the sink costs the learner's writes; "offload-base"
           (only with --variants) is "offloaded" with the spool's pipe
           reader as it was before 2026-11-27 (os.read + os.write, a fixed
           5 ms pause after a short read) for a same-run comparison;
           "offload-nohook" (only with --variants) is "offloaded" without
           the learners' line-buffering hook (services/controller/linebuf.py,
           on by default as the controller runs learners): write-through,
           two write(2) calls per print() instead of one. With --print the
           learner prints its lines (print(line), as most scripts do)
           instead of writing each with its newline (sys.stdout.write)
  read   : a finished job's log of N lines through the API (archive
           streaming, real HTTP server) and the CLI (`trainforge logs`,
           output discarded), lines/s

Usage: .venv/bin/python bench/log_flood.py [-n 200000] [-r 3] [--batch 2000]
         [--only learner --variants null,offload,offload-nohook [--print]]
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import logging
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from click.testing import CliRunner  # noqa: E402

from tests.fakes.trainer_memory import InMemoryTrainer  # noqa: E402
from tests.servers import serve_app, start_mongo, start_osmem  # noqa: E402
from trainforge.cli import main as cli_main  # noqa: E402
from trainforge_services.api.app import create_app  # noqa: E402
from trainforge_services.api.identity import IdentityStore, Role  # noqa: E402
from trainforge_services.common.adapters.logstore import LogStore  # noqa: E402
from trainforge_services.common.adapters.mongo import connect  # noqa: E402
from trainforge_services.common.adapters.objectstore import LocalStore  # noqa: E402
from trainforge_services.common.settings import ApiSettings  # noqa: E402
from trainforge_services.common.states import JobState  # noqa: E402
from trainforge_services.controller import learner as learner_module  # noqa: E402
from trainforge_services.controller import spool as spool_module  # noqa: E402
from trainforge_services.controller.controller import ARCHIVE_FLUSH_SECONDS  # noqa: E402
from trainforge_services.controller.learner import LearnerProcess  # noqa: E402
from trainforge_services.controller.linebuf import with_hook  # noqa: E402
from trainforge_services.controller.logship import LogArchive, LogShipper  # noqa: E402
from trainforge_services.controller.priority import plan_placement, set_output_cpus  # noqa: E402

FLOOD = ("import sys\nw = sys.stdout.write\npad = 'x' * 76\n"
         "for i in range({n}):\n    w(f'line {{i:07d}} {{pad}}\\n')\n")
FLOOD_PRINT = ("pad = 'x' * 76\n"
               "for i in range({n}):\n    print(f'line {{i:07d}} {{pad}}')\n")


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} vCPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
            f"{platform.python_implementation()} {platform.python_version()}, "
            "load {:.2f} {:.2f} {:.2f}".format(*psutil.getloadavg()))


def write_archive(path: Path, job: str, n: int) -> None:
    archive = LogArchive(path, job=job, team="bench", learner=0, attempt=1)
    pad = "x" * 76
    for i in range(n):
        archive.append("stdout", f"line {i:07d} {pad}")
    archive.close()


def ship_archive(archive: Path, sink, n: int, batch: int) -> float:  # noqa: ANN001 - a LogSink
    """Lines/s of a `LogShipper` tailing the finished archive into `sink`."""
    shipper = LogShipper(archive, sink, max_lines=batch, max_seconds=0.05)
    start = time.perf_counter()
    shipper.start()
    shipper.notify()
    if not shipper.close(600) or shipper.shipped != n:
        raise RuntimeError(f"shipped {shipper.shipped} of {n}: {shipper.last_error}")
    return n / (time.perf_counter() - start)


def run_ship(url: str, archive: Path, n: int, batch: int, index: str) -> float:
    store = LogStore(url, index)
    store.ensure_index()
    rate = ship_archive(archive, store, n, batch)
    store.close()
    return rate


def run_bulk(url: str, archive: Path, n: int, batch: int, index: str) -> float:
    store = LogStore(url, index)
    store.ensure_index()
    docs = []
    for raw in archive.read_bytes().splitlines(keepends=True):
        d = json.loads(raw)
        docs.append((f"{d['job']}.0.1.{d['seq']}", raw))
    start = time.perf_counter()
    for k in range(0, len(docs), batch):
        store.write_raw(docs[k:k + batch])
    rate = n / (time.perf_counter() - start)
    store.close()
    return rate


def pin_threads(pid: int, cpus: set[int] | frozenset[int]) -> None:
    """Every thread of process pid on cpus (affinity is per thread)."""
    for t in psutil.Process(pid).threads():
        try:
            os.sched_setaffinity(t.id, cpus)
        except OSError:
            pass


@contextmanager
def reader_before_splice(active: bool) -> Iterator[None]:
    """While active: the spool's pipe reader as before 2026-11-27 (read + write, fixed pause)."""
    if not active:
        yield
        return
    stream, pause = learner_module.SpooledStream, spool_module.reader_pause
    learner_module.SpooledStream = functools.partial(stream, splice=False)
    spool_module.reader_pause = lambda got, interval, pipe_bytes, longest: 0.0 if got >= pipe_bytes else longest
    try:
        yield
    finally:
        learner_module.SpooledStream, spool_module.reader_pause = stream, pause


def run_learner(n: int, tmp: Path, url: str | None, index: str, *, devnull: bool = True,
                buffered: bool = False, placed: str = "", store_pid: int | None = None,
                before: bool = False, hook: bool = True, prints: bool = False) -> tuple[float, float]:
    """Wall seconds from start to exit and the CPU seconds of the learner's processes (user + system);
    url None and devnull False: the controller's pipes and archive, no shipper. placed "both": the learner
    and the output threads placed; "output": only the output threads (and the store) moved off the learner's
    CPU, the learner left to the scheduler."""
    plan = plan_placement(1) if placed else None
    if placed and plan is None:
        raise RuntimeError("no CPU to spare for placement on this host")
    set_output_cpus(plan.output if plan else None)
    if store_pid is not None:
        pin_threads(store_pid, plan.output if plan else os.sched_getaffinity(0))
    start = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        with reader_before_splice(before):
            wall = _run_learner(n, tmp, url, index, devnull=devnull, buffered=buffered,
                                cpus=plan.learner if plan and placed == "both" else None, hook=hook, prints=prints)
        end = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime
    finally:
        set_output_cpus(None)


def _run_learner(n: int, tmp: Path, url: str | None, index: str, *, devnull: bool, buffered: bool,
                 cpus: frozenset[int] | None, hook: bool, prints: bool) -> float:
    script = (FLOOD_PRINT if prints else FLOOD).format(n=n)
    if url is None and devnull:
        cmd = f"python -c {shlex.quote(script)} > /dev/null"
    else:
        cmd = f"python -c {shlex.quote(script)}"
    archive_path = tmp / f"learner-{time.monotonic_ns()}.jsonl"
    store = LogStore(url or "http://127.0.0.1:9", index)
    shipper = LogShipper(archive_path, store, max_lines=2000, max_seconds=0.5) if url else None
    archive = LogArchive(archive_path, job="bench-learner", team="bench", learner=0, attempt=1,
                         on_append=shipper.notify if shipper else None, flush_interval=ARCHIVE_FLUSH_SECONDS)
    if shipper:
        shipper.before_read = archive.flush
        shipper.start()
    env = dict(os.environ)
    # The controller runs learners unbuffered (one write per line: logs follow live); a manifest's
    # `env: {PYTHONUNBUFFERED: ""}` turns that off. The /dev/null baseline runs the same way.
    env["PYTHONUNBUFFERED"] = "" if buffered else "1"
    if hook:  # as learner_env does; on /dev/null (not a pipe) the hook changes nothing
        with_hook(env, {})
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    proc = LearnerProcess(cmd, tmp, env, archive, cpus=cpus)
    start = time.perf_counter()
    proc.start()
    proc.wait(600)
    elapsed = time.perf_counter() - start
    proc.finish_output(10)
    archive.close()
    if shipper:
        shipper.close(0.1)
    store.close()
    if (url or not devnull) and archive.lines_written != n:
        raise RuntimeError(f"archived {archive.lines_written} of {n}")
    return elapsed


def run_read(api_url: str, key: str, state: Path, job: str, n: int) -> float:

    runner = CliRunner(env={"TF_STATE_DIR": str(state), "TRAINFORGE_API_URL": api_url, "TRAINFORGE_API_KEY": key})
    start = time.perf_counter()
    with redirect_stdout(io.StringIO()):
        result = runner.invoke(cli_main, ["logs", job], catch_exceptions=False)
    elapsed = time.perf_counter() - start
    got = result.stdout.count("\n")
    if result.exit_code != 0 or got != n:
        raise RuntimeError(f"read {got} of {n} lines (exit {result.exit_code}): {result.stdout[-300:]}")
    return n / elapsed


def summary(name: str, values: list[float], unit: str, digits: int = 1) -> str:
    return (f"{name:<30} median {statistics.median(values):>10,.{digits}f} {unit}  "
            f"spread {min(values):,.{digits}f}-{max(values):,.{digits}f}  "
            f"runs {', '.join(f'{v:,.{digits}f}' for v in values)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=200_000, help="lines per run")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2000, help="lines per _bulk request (the shipper's default)")
    ap.add_argument("--only", choices=("ship", "learner", "read"), help="run one part")
    ap.add_argument("--buffered", action="store_true",
                    help="learners with buffered output (PYTHONUNBUFFERED empty) instead of the platform's default")
    ap.add_argument("--variants", default="null,flood,placed,offload,archive",
                    help="learner variants, comma-separated, from null, flood, placed, offload, archive, "
                         "offload-base, offload-nohook")
    ap.add_argument("--print", dest="prints", action="store_true",
                    help="the learner prints its lines (print(line)) instead of sys.stdout.write(line + newline)")
    args = ap.parse_args()
    # The learner runs stop their shippers at once: their "gave up" warnings are expected.
    logging.getLogger("trainforge_services").setLevel(logging.ERROR)
    print(machine())
    osmem = start_osmem()
    ship, bulk, read = [], [], []
    variants = tuple(args.variants.split(","))
    known = ("null", "flood", "placed", "offload", "archive", "offload-base", "offload-nohook")
    if "null" not in variants or not set(variants) <= set(known):
        ap.error(f"--variants: null and any of {', '.join(known[1:])}")
    walls: dict[str, list[float]] = {v: [] for v in variants}
    cpus: dict[str, list[float]] = {v: [] for v in variants}
    try:
        with tempfile.TemporaryDirectory(prefix="tf-bench-logs-") as tmpname:
            tmp = Path(tmpname)
            archive = tmp / "archive.jsonl"
            write_archive(archive, "bench-job", args.n)
            for r in range(args.rounds):
                if args.only in (None, "ship"):
                    for which in (("ship", "bulk") if r % 2 == 0 else ("bulk", "ship")):
                        run = run_ship if which == "ship" else run_bulk
                        rate = run(osmem.url, archive, args.n, args.batch, f"bench-{which}-{r}")
                        (ship if which == "ship" else bulk).append(rate)
                        print(f"round {r} {which:<5} {rate:,.0f} lines/s", flush=True)
                if args.only in (None, "learner"):
                    for which in (variants if r % 2 == 0 else variants[::-1]):
                        url = (osmem.url if which in ("flood", "placed", "offload", "offload-base", "offload-nohook")
                               else None)
                        secs, cpu = run_learner(args.n, tmp, url, f"bench-learner-{r}", devnull=which == "null",
                                                buffered=args.buffered,
                                                placed={"placed": "both", "offload": "output",
                                                        "offload-base": "output",
                                                        "offload-nohook": "output"}.get(which, ""),
                                                store_pid=osmem.proc.pid, before=which == "offload-base",
                                                hook=which != "offload-nohook", prints=args.prints)
                        walls[which].append(secs)
                        cpus[which].append(cpu)
                        print(f"round {r} learner {which:<14} {secs:.3f} s wall, {cpu:.3f} s CPU", flush=True)
            if args.only in (None, "read"):
                read.extend(bench_read(tmp, archive, args.n, args.rounds))
    finally:
        osmem.cleanup()
    if ship:
        print(summary("raw _bulk", bulk, "lines/s"))
        print(summary("shipper", ship, "lines/s"))
        print(f"shipping / raw bulk     {statistics.median(ship) / statistics.median(bulk):.3f}")
    if walls["null"]:
        print(f"learner: {args.n:,} lines of ~90 bytes, {'print()' if args.prints else 'sys.stdout.write'}, "
              f"{'buffered' if args.buffered else 'unbuffered (PYTHONUNBUFFERED=1, line-buffering hook)'}, "
              f"{args.rounds} alternating rounds; wall = start to exit, CPU = user+system of the learner's "
              "processes; load now {:.2f} {:.2f} {:.2f}".format(*psutil.getloadavg()))
        names = {"null": "/dev/null (baseline)", "flood": "controller, unplaced", "placed": "controller, placed",
                 "offload": "controller, offloaded", "archive": "pipes only, unplaced",
                 "offload-base": "offloaded, reader before", "offload-nohook": "offloaded, no hook"}
        for v in variants:
            print(summary(f"{names[v]} wall", walls[v], "s", 3))
            print(summary(f"{names[v]} CPU", cpus[v], "s", 3))
        print("slowdown against /dev/null, wall (CPU) medians; the goal is <= +5 % wall:")
        for v in (v for v in variants if v != "null"):
            w = statistics.median(walls[v]) / statistics.median(walls["null"]) - 1
            c = statistics.median(cpus[v]) / statistics.median(cpus["null"]) - 1
            per = ", ".join(f"{x / d - 1:+.0%}" for x, d in zip(walls[v], walls["null"], strict=True))
            print(f"  {names[v]:<24} {w:+7.1%} ({c:+.1%})  per round: {per}")
        print("  offloaded (TF_PLACE_CPUS=output, the default): the output threads and, here, the "
              "log store's threads kept off the last CPU, the learner unpinned; placed (TF_PLACE_CPUS=all): the "
              "learner pinned to the last CPU too; unplaced: TF_PLACE_CPUS=off")
    if read:
        print(summary("read API+CLI", read, "lines/s"))
    return 0


def bench_read(tmp: Path, archive: Path, n: int, rounds: int) -> list[float]:

    mongo = start_mongo()
    try:
        db = connect(mongo.url, "tfbench")
        identity = IdentityStore(db)
        identity.create_team("bench")
        key = identity.issue_key("bench", "bench", Role.MEMBER)
        job = "j-0123456789ab"
        objects = LocalStore(tmp / "objects")
        objects.put_file(f"jobs/{job}/logs/0-1.jsonl", archive)
        trainer = InMemoryTrainer()
        trainer.submit_job(team="bench", manifest_json='{"name": "flood"}', code_uri="", submitted_by="b",
                           job_id=job)
        for s in (JobState.DEPLOYING, JobState.RUNNING, JobState.STORING, JobState.COMPLETED):
            trainer.report(job, s, "bench")
        app = create_app(ApiSettings(dev_mode=True, rate_limit_per_second=0), trainer=trainer, identity=identity,
                         logs=LogStore("http://127.0.0.1:9"), objects=objects)
        rates = []
        with serve_app(app) as url:
            for r in range(rounds):
                rates.append(run_read(url, key, tmp / "cli", job, n))
                print(f"round {r} read {rates[-1]:,.0f} lines/s", flush=True)
        db.client.close()
        return rates
    finally:
        mongo.cleanup()


threading.excepthook = lambda args: print(f"thread error: {args.exc_value}", file=sys.stderr)

if __name__ == "__main__":
    sys.exit(main())

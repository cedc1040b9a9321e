"""A slot's handover in a prestarted sweep, hop by hop: from one trial's last user line to the next trial's first.

Runs one experiment as bench/gate_trace.py does (N trials of S seconds, `max_parallel` P, `prestart` 1, a
`python -c` command that prints the wall-clock time first and last), then joins, per held trial, the stamps
that every service on the way leaves on this host (one clock, milliseconds):

- the predecessor's last user line (T1, printed by the program) and its controller's "learner exited";
- its job monitor's "RUNNING -> STORING" line (the monitor saw the controller's status in etcd);
- the STORING stamp of its status history (the Trainer's transition, written in MongoDB);
- the next trial's "gate opened by experiment-driver" (the Trainer's log: the gate's compare-and-set done);
- the LCM's "opening the gate" (the OpenGate RPC received; the etcd key is written next);
- the next trial's controller's system line "the gate opened: starting the learner" (its watch fired);
- its first user line (T0).

The predecessor of a held trial is the trial whose monitor reported STORING last before its gate's
compare-and-set: the slot it took. Medians (min, max) of each hop are printed, in ms.

Usage: .venv/bin/python bench/chain_trace.py [--trials 20] [--parallel 2] [--seconds 1] [--cpus 0.5]
       .venv/bin/python bench/chain_trace.py --state /tmp/tf-bench-XXXX   (the logs a finished run left,
       bench/gate_trace.py's in another tree, say: every hop but the Trainer's STORING stamp)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from datetime import datetime
from pathlib import Path

from _stack import machine_line, stack
from gate_trace import GATE_LINE, command

from trainforge.sdk import Client

_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
_DRIVER = re.compile(_STAMP + r" .*job (\S+): gate opened by experiment-driver")
_LCM = re.compile(_STAMP + r" .*opening the gate of job (\S+) ")


def _local(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _iso(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _first(path: Path, pattern: str) -> float | None:
    """The stamp of a service log's first line that holds `pattern`."""
    if not path.exists():
        return None
    for line in path.read_text(errors="replace").splitlines():
        if pattern in line:
            return _local(line[:23])
    return None


def _firsts(path: Path, pattern: re.Pattern) -> dict[str, float]:
    found: dict[str, float] = {}
    for m in pattern.finditer(path.read_text(errors="replace")):
        found.setdefault(m.group(2), _local(m.group(1)))
    return found


def collect(state: Path, histories: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Every trial's stamps (see the module's doc) from the stack's logs and the status histories."""
    driver = _firsts(state / "logs" / "trainer.log", _DRIVER)
    lcm = _firsts(state / "logs" / "lcm.log", _LCM)
    marks: dict[str, dict[str, float]] = {}
    for job_id, history in histories.items():
        folder = state / "work" / job_id / "1"
        m = dict(history)
        for raw in (folder / "learner-0-1.log.jsonl").read_text().splitlines():
            line = json.loads(raw)
            text = line.get("line", "")
            if text == GATE_LINE:
                m["gate seen"] = _iso(line["ts"])
            parts = text.split()
            if len(parts) == 2 and parts[0] in ("T0", "T1"):
                m[parts[0]] = float(parts[1])
        for key, path, pattern in (("exited", folder / "controller-0.log", "learner exited"),
                                   ("monitor storing", folder / "monitor.log", "RUNNING -> STORING")):
            found = _first(path, pattern)
            if found is not None:
                m[key] = found
        if job_id in driver:
            m["gate cas"] = driver[job_id]
        if job_id in lcm:
            m["lcm"] = lcm[job_id]
        marks[job_id] = m
    return marks


HOPS = (
    ("the last user line -> the controller sees the exit", "prev", "T1", "prev", "exited"),
    ("-> the monitor reports STORING", "prev", "exited", "prev", "monitor storing"),
    ("-> the Trainer's STORING stamp", "prev", "monitor storing", "prev", "storing"),
    ("-> the next gate's compare-and-set (driver)", "prev", "storing", "next", "gate cas"),
    ("the monitor's STORING -> the next gate's compare-and-set", "prev", "monitor storing", "next", "gate cas"),
    ("-> the LCM's OpenGate", "next", "gate cas", "next", "lcm"),
    ("-> the held controller's watch fires", "next", "lcm", "next", "gate seen"),
    ("-> the next trial's first user line", "next", "gate seen", "next", "T0"),
    ("last user line -> next first user line (total)", "prev", "T1", "next", "T0"),
)


def hops(marks: dict[str, dict[str, float]]) -> dict[str, list[float]]:
    """Each hop's durations (s) over the held trials that have every stamp."""
    storing = sorted((m["monitor storing"], j) for j, m in marks.items() if "monitor storing" in m)
    rows: dict[str, list[float]] = {name: [] for name, *_ in HOPS}
    for m in marks.values():
        if "gate cas" not in m:
            continue
        before = [j for t, j in storing if t <= m["gate cas"]]
        if not before:
            continue
        pair = {"prev": marks[before[-1]], "next": m}
        for name, a, ka, b, kb in HOPS:
            if ka in pair[a] and kb in pair[b]:
                rows[name].append(pair[b][kb] - pair[a][ka])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--cpus", type=float, default=0.5, help="each trial's `resources.cpus` (its CPU quota)")
    ap.add_argument("--state", type=Path, help="only read the logs of a finished run's stack (its state folder)")
    args = ap.parse_args()
    if args.state is not None:
        jobs = {p.name: {} for p in (args.state / "work").iterdir() if (p / "1" / "learner-0-1.log.jsonl").exists()}
        report(hops(collect(args.state, jobs)))
        print(driver_passes(args.state))
        return 0
    recipe = {"kind": "experiment", "name": "chain-trace", "framework": "custom", "command": command(args.seconds),
              "resources": {"cpus": args.cpus, "memory": "256Mi"},
              "parameters": {"i": {"range": [0, args.trials - 1], "sampling": "int"}}, "mode": "grid",
              "max_parallel": args.parallel, "prestart": 1}
    with stack() as st:
        client = Client(st.api_url, st.api_key)
        t0 = time.time()
        exp = client.experiments.submit(json.dumps(recipe, indent=1))
        while exp["state"] == "running":
            time.sleep(0.2)
            exp = client.experiments.get(exp["id"])
        makespan = time.time() - t0
        if exp["state"] != "completed":
            raise SystemExit(f"experiment {exp['id']} ended {exp['state']}: {exp['reason']}")
        histories = {}
        for trial in exp["trials"]:
            stamps: dict[str, float] = {}
            for event in sorted(client.get(trial["job_id"])["history"], key=lambda h: h["timestamp"]):
                stamps.setdefault(event["to"], event["timestamp"])
            histories[trial["job_id"]] = stamps
        state = st.state
        # read while the stack is up: a stack that ended well may remove its state folder (TF_BENCH_KEEP=1 keeps it)
        rows = hops(collect(state, histories))
        passes = driver_passes(state)
    print(machine_line())
    ideal = args.trials * args.seconds / args.parallel
    print(f"{args.trials} trials of {args.seconds:g} s, {args.parallel} at once, prestart 1: makespan "
          f"{makespan:.2f} s ({(makespan / ideal - 1) * 100:+.0f} % over the ideal {ideal:.2f} s); state {state}")
    report(rows)
    print(passes)
    return 0


_PASS = re.compile(r"experiment pass: \d+ experiment\(s\) in (\d+(?:\.\d+)?) ms, cpu (\d+(?:\.\d+)?) ms")


def driver_passes(state: Path) -> str:
    """The experiment driver's passes in the run (the Trainer's timing lines; none in a tree without them)."""
    found = [(float(ms), float(cpu)) for ms, cpu in _PASS.findall((state / "logs" / "trainer.log").read_text())]
    if not found:
        return "driver passes: no timing lines in the Trainer's log"
    return (f"driver passes: {len(found)}, median {statistics.median(ms for ms, _ in found):.1f} ms, "
            f"CPU {sum(cpu for _, cpu in found):.0f} ms in all")


def report(rows: dict[str, list[float]]) -> None:
    print(f"{len(rows[HOPS[-1][0]])} handovers; medians (min, max) in ms:")
    for name, values in rows.items():
        if values:
            print(f"  {name:56}{statistics.median(values) * 1000:8.0f}  ({min(values) * 1000:.0f}, "
                  f"{max(values) * 1000:.0f})")


if __name__ == "__main__":
    raise SystemExit(main())

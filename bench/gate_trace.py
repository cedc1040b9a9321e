"""Where a prestarted trial's slot handover goes: from the gate opening to the user's first line, and from the
user's last line to the next gate opening.

Starts a private embedded stack (as bench/sweep_overhead.py), runs one experiment of N trials of S seconds,
`max_parallel` P, `prestart` 1, whose command prints the wall-clock time as its first and last statements
(`python -c`, so the interpreter's start is inside the trial as in the sweep bench), and prints medians over
the trials that were held, from four clocks on the same host:

- gate open: the controller's system line "the gate opened: starting the learner" (its archive's stamp, ms);
- user first / last: the times the trial's program printed;
- the status history's RUNNING and STORING stamps (the Trainer's, as the job monitor reported them).

Usage: .venv/bin/python bench/gate_trace.py [--trials 20] [--parallel 2] [--seconds 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime

from _stack import machine_line, stack

from trainforge.sdk import Client

GATE_LINE = "the gate opened: starting the learner"


def command(seconds: float) -> str:
    return ("python -c \"import time; print('T0', time.time(), flush=True); "
            f"time.sleep({seconds}); print('T1', time.time(), flush=True)\"")


def when(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def trace(client: Client, job_id: str) -> dict[str, float]:
    """The trial's gate, first and last user line, and its RUNNING/STORING stamps."""
    marks: dict[str, float] = {}
    for line in client.stream_logs(job_id):
        text = line.get("line", "")
        if text == GATE_LINE:
            marks["gate"] = when(line["ts"])
        parts = text.split()
        if len(parts) == 2 and parts[0] in ("T0", "T1"):
            marks[parts[0]] = float(parts[1])
    job = client.get(job_id)
    for event in sorted(job["history"], key=lambda h: h["timestamp"]):
        marks.setdefault(event["to"], event["timestamp"])
    return marks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    recipe = {"kind": "experiment", "name": "gate-trace", "framework": "custom", "command": command(args.seconds),
              "resources": {"cpus": 0.5, "memory": "256Mi"},
              "parameters": {"i": {"range": [0, args.trials - 1], "sampling": "int"}}, "mode": "grid",
              "max_parallel": args.parallel, "prestart": 1}
    with stack() as st:
        client = Client(st.api_url, st.api_key)
        t0 = time.time()
        exp = client.experiments.submit(json.dumps(recipe, indent=1))  # text, not a path
        while exp["state"] == "running":
            time.sleep(0.2)
            exp = client.experiments.get(exp["id"])
        makespan = time.time() - t0
        if exp["state"] != "completed":
            raise SystemExit(f"experiment {exp['id']} ended {exp['state']}: {exp['reason']}")
        runs = [trace(client, t["job_id"]) for t in exp["trials"]]
    print(machine_line())
    ideal = args.trials * args.seconds / args.parallel
    print(f"{args.trials} trials of {args.seconds:g} s, {args.parallel} at once, prestart 1: makespan "
          f"{makespan:.2f} s ({(makespan / ideal - 1) * 100:+.0f} % over the ideal {ideal:.2f} s)")
    held = [r for r in runs if "gate" in r]
    ends = sorted(r["T1"] for r in runs)
    rows = {
        "gate open -> user's first line": [r["T0"] - r["gate"] for r in held],
        "gate open -> RUNNING stamp": [r["running"] - r["gate"] for r in held],
        "user's first line -> last line (the sleep)": [r["T1"] - r["T0"] for r in runs],
        "user's last line -> STORING stamp": [r["storing"] - r["T1"] for r in runs],
        "STORING stamp -> COMPLETED stamp": [r["completed"] - r["storing"] for r in runs],
        # the slot this trial took: the latest user exit before its gate opened
        "a user's last line -> next gate open": [r["gate"] - max(e for e in ends if e <= r["gate"])
                                                 for r in held if any(e <= r["gate"] for e in ends)],
    }
    print(f"{len(held)} of {len(runs)} trials were held; medians (min, max) in ms:")
    for name, values in rows.items():
        if values:
            print(f"  {name:46}{statistics.median(values) * 1000:8.0f}  ({min(values) * 1000:.0f}, "
                  f"{max(values) * 1000:.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

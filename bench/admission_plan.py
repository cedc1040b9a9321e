"""The admission decision alone (`admission.plan`), in process: Q queued in T teams of one cohort, R running.

Times one pass's decision with the backend full and with 50 learners free,
medians of 3. `--baseline FILE` times another admission module the same way
in the same run, e.g. the branch point's:

    git show 4c5dccd:services/trainer/admission.py > /tmp/old_admission.py
    PYTHONPATH=$PWD .venv/bin/python bench/admission_plan.py --baseline /tmp/old_admission.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

from _stack import machine_line

from trainforge_services.trainer import admission, cohorts
from trainforge_services.trainer.resources import BackendSize, Queued, Quota, Usage


def load(path: str):  # noqa: ANN201 - a module
    spec = importlib.util.spec_from_file_location("baseline_admission", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queued", default="1000,10000", help="queue lengths, comma-separated")
    ap.add_argument("--running", type=int, default=1000)
    ap.add_argument("--teams", type=int, default=30)
    ap.add_argument("--baseline", default="", help="another admission.py to time the same way")
    args = ap.parse_args()
    teams = [f"t{i}" for i in range(args.teams)]
    quotas = {t: Quota(cpus=-(-args.running // args.teams), cohort="c") for t in teams}
    cap = BackendSize(Usage(0, float(args.running), 1 << 50, args.running))
    one = Usage(0, 1.0, 64 << 20, 1)
    held = [(teams[i % args.teams], one, "") for i in range(args.running)]
    modules = [("after", admission)] + ([("baseline", load(args.baseline))] if args.baseline else [])
    print(machine_line())
    for q in (int(x) for x in args.queued.split(",")):
        queue = [Queued(f"j{i}", teams[i % args.teams], one, 1, float(i)) for i in range(q)]
        for free in (0, 50):
            hh = held[:args.running - free]
            cells = []
            for name, mod in modules:
                times = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    plan = mod.plan(queue, admission.total(n for _, n, _ in hh), cap,
                                    quotas=cohorts.ceilings(quotas), teams=admission.team_use(hh),
                                    fit=cohorts.Book(quotas, {}).fit)
                    times.append((time.perf_counter() - t0) * 1000)
                cells.append(f"{name} {statistics.median(times):8.1f} ms ({len(plan.dispatch)} dispatched)")
            print(f"queued {q:6d}, {free:2d} learners free: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

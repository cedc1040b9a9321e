"""A follower's poll: every job of the team listed again, against only the jobs changed since its last listing.

Starts a private embedded stack, submits one trivial job and cancels it,
then copies its ended document N-1 times straight into the stack's store
(new ids, creation and change times an hour back, no idempotency key), so
the team has N ended jobs without running N jobs. Then it takes a listing's
`as_of`, submits and cancels K more jobs (the changes a follower would see)
and alternates R rounds of:
- the full listing: GET /v1/jobs with no filter, every page of `--page`
  jobs (what bench/burst.py's and bench/job_cpu.py's followers did each
  round, and a client re-listing its jobs does);
- the listing of what changed: GET /v1/jobs?changed_since=<that as_of>,
  which returns the K jobs (and any job changed within the Trainer's small
  margin before the as_of).
Prints the machine line, the jobs each returned, the median (min-max) of
each in ms and the ratio full / changed of the medians. Usage:

    PYTHONPATH=$PWD .venv/bin/python bench/changed_listing.py [-n 1000] [-k 5] [-r 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import pymongo
from _stack import machine_line, spread, stack

from tests.servers import wait_for
from trainforge.sdk import Client
from trainforge_services.devstack import storesock

MANIFEST = {"name": "listed", "framework": "custom", "resources": {"cpus": 0.05, "memory": "64Mi"},
            "command": "python -c \"print('listed')\""}


def ended_job(client: Client) -> str:
    """A job submitted and cancelled at once (it ends cancelled, or completed if it was that quick)."""
    job = client.submit(MANIFEST)
    try:
        client.cancel(job["id"])
    except Exception:  # noqa: BLE001, S110 - it ended before the cancel: as good
        pass
    wait_for(lambda: client.get(job["id"])["state"] in ("cancelled", "completed", "failed"), 120, "the job's end")
    return job["id"]


def store_jobs(st) -> pymongo.MongoClient:  # noqa: ANN001
    # the embedded stack's MongoDB listens on a unix socket in its state dir (devstack/storesock.py)
    return pymongo.MongoClient(storesock.mongo_url(st.state / "mongo" / "mongo.sock"))


def wait_cleaned(st, job_ids: set[str]) -> None:  # noqa: ANN001
    """Until none of these jobs waits for its learners' removal (`cleanup_pending`): a job cancelled after
    its dispatch is stamped once more when that is done, and copies of a job still pending would each be
    cleaned up, and so changed, in the middle of the timing."""
    store = store_jobs(st)
    try:
        jobs = store["trainforge"]["jobs"]
        wait_for(lambda: not jobs.count_documents({"_id": {"$in": sorted(job_ids)}, "cleanup_pending": True}), 120,
                 "the jobs' cleanup")
    finally:
        store.close()


def copy_ended(st, job_id: str, n: int) -> None:  # noqa: ANN001
    """n copies of an ended job's document in the stack's store, created and changed an hour back."""
    wait_cleaned(st, {job_id})
    store = store_jobs(st)
    try:
        jobs = store["trainforge"]["jobs"]
        doc = jobs.find_one({"_id": job_id})
        doc.pop("idempotency_key", None)
        back = time.time() - 3600
        copies = [{**doc, "_id": f"{job_id}-c{i}", "created_at": back + i * 1e-3, "changed_at": back + i * 1e-3}
                  for i in range(n)]
        for i in range(0, len(copies), 200):
            jobs.insert_many(copies[i:i + 200])
    finally:
        store.close()


def timed(fn) -> tuple[float, int]:  # noqa: ANN001
    t0 = time.perf_counter()
    jobs, _ = fn()
    return time.perf_counter() - t0, len(jobs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=1000, help="ended jobs the team has")
    ap.add_argument("-k", type=int, default=5, help="jobs changed since the follower's last listing")
    ap.add_argument("-r", type=int, default=5, help="rounds (each: full, then changed; order flipped each round)")
    ap.add_argument("--page", type=int, default=1000, help="jobs per page (the API's largest page is 1000)")
    args = ap.parse_args()

    with stack({"TF_RATE_LIMIT_PER_SECOND": "0"}) as st:
        client = Client(st.api_url, st.api_key, timeout=120)
        copy_ended(st, ended_job(client), args.n - 1)
        time.sleep(0.5)  # past the Trainer's margin (EXACT_MARGIN), so the as_of below comes after every copy
        _, as_of = client.list_changed(time.time(), page_size=args.page)
        changed_ids = {ended_job(client) for _ in range(args.k)}
        wait_cleaned(st, changed_ids)  # their last change made before the timing
        full = lambda: client.list_changed(None, page_size=args.page)  # noqa: E731
        changed = lambda: client.list_changed(as_of, page_size=args.page)  # noqa: E731
        got, _ = changed()
        if not changed_ids <= {j["id"] for j in got}:
            print(f"the changed listing missed {sorted(changed_ids - {j['id'] for j in got})}", file=sys.stderr)
            return 1
        timed(full)  # warm both paths once
        rounds: dict[str, list[float]] = {"full": [], "changed": []}
        counts: dict[str, int] = {}
        for i in range(args.r):
            order = (("full", full), ("changed", changed))
            for name, fn in (order if i % 2 == 0 else order[::-1]):
                secs, counts[name] = timed(fn)
                rounds[name].append(secs * 1000)
        client.close()

    print(machine_line())
    print(f"GET /v1/jobs of a team with {counts['full']} jobs ({args.n} ended + {args.k} changed), pages of "
          f"{args.page}, {args.r} alternating rounds")
    print(f"full listing        {counts['full']:6d} jobs   ms {spread(rounds['full'])}")
    print(f"changed since as_of {counts['changed']:6d} jobs   ms {spread(rounds['changed'])}")
    print(f"ratio full / changed (of the medians) "
          f"{statistics.median(rounds['full']) / statistics.median(rounds['changed']):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The job's private network: one network namespace, `tf-<job>`, with only loopback up.

Every learner of a job joins it, so the DDP rendezvous on 127.0.0.1 works
between ranks while nothing on the host's loopback (etcd, the Mongo-wire
server, the log store, the API, the Trainer) is reachable, and there is no
route out: egress is none, except what the job's egress policy has the
controller relay (egress.py). The first controller of the job to get here
creates it, under a lock so a second one never joins a half-made namespace;
the local backend's stop deletes it (trainforge_services.common.isolation.remove_job).
"""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

from trainforge_services.common.isolation import NETNS_DIR, NETNS_LOCKS, netns_name


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
    if out.returncode != 0:
        raise OSError(f"ip {' '.join(args)} failed: {out.stderr.strip() or out.returncode}")


def path_of(job_id: str) -> Path:
    return NETNS_DIR / netns_name(job_id)


def ensure(job_id: str) -> Path:
    """The job's namespace file, made (loopback up) when it is not there yet; OSError when that fails."""
    name = netns_name(job_id)
    path = NETNS_DIR / name
    NETNS_LOCKS.mkdir(parents=True, exist_ok=True)
    with open(NETNS_LOCKS / name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
    return path

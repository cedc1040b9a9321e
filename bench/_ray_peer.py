"""The Ray Jobs peer of bench/submit_latency.py; runs under the bench venv's Python (`make bench-venv`).

Starts a private single-node Ray cluster (head only, no dashboard UI build needed), runs one untimed
warm-up job (the job agent starts after the dashboard), submits N jobs whose entrypoint is the given
command one after another through the Jobs SDK, polls each until it ends, and prints one JSON line
{"running": [...], "completed": [...]} of seconds from submit, then stops the cluster (its own
processes only). Usage: "$(tools/benchvenv/setup.sh --where)"/bin/python bench/_ray_peer.py N COMMAND
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    n, command = int(sys.argv[1]), sys.argv[2]
    ray = str(Path(sys.executable).parent / "ray")
    tmp = tempfile.mkdtemp(prefix="tf-ray-")
    # A token left in ~/.ray/auth_token by an earlier Ray turns token authentication on for the cluster
    # while the Jobs client sends none; this private loopback cluster runs without it.
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    port = _free_port()
    subprocess.run([ray, "start", "--head", "--num-cpus", "2", "--temp-dir", tmp, "--include-dashboard", "true",
                    "--dashboard-host", "127.0.0.1", "--dashboard-port", str(port)], check=True, env=env,
                   stdout=subprocess.DEVNULL, timeout=300, start_new_session=True)
    try:
        from ray.job_submission import JobStatus, JobSubmissionClient

        client = _client(JobSubmissionClient, f"http://127.0.0.1:{port}")
        _ready(client, JobStatus)
        running, completed = [], []
        for _ in range(n):
            t0 = time.time()
            job = client.submit_job(entrypoint=command)
            seen_running = None
            while True:
                info = client.get_job_info(job)
                if info.status == JobStatus.RUNNING and seen_running is None:
                    # first seen RUNNING (polled every 20 ms): Ray's start_time is stamped at submission
                    seen_running = time.time() - t0
                if info.status.is_terminal():
                    break
                time.sleep(0.02)
            if info.status != JobStatus.SUCCEEDED:
                print(f"ray job {job} ended {info.status}: {info.message}", file=sys.stderr)
                return 1
            completed.append(info.end_time / 1000 - t0)
            # a job that ended between two polls was RUNNING at the latest when it ended
            running.append(seen_running if seen_running is not None else info.end_time / 1000 - t0)
        print(json.dumps({"running": running, "completed": completed}))
        return 0
    finally:
        _stop(tmp)


def _stop(tmp: str) -> None:
    """Stop this cluster only: `ray stop` would stop every Ray on the machine (another bench's too).

    Its daemons all carry the session's temp dir in their command line and share a process group
    (`ray start` ran in a session of its own); that group is ended, SIGKILL after 15 s."""
    groups = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if tmp.encode() in cmdline.read_bytes():
                groups.add(os.getpgid(int(cmdline.parent.name)))
        except (OSError, ValueError):
            continue
    groups.discard(os.getpgid(0))
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
        deadline = time.monotonic() + wait
        while groups and time.monotonic() < deadline:
            groups = {g for g in groups if _group_alive(g)}
            time.sleep(0.2)
        if not groups:
            return


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client(cls, address: str):  # noqa: ANN001, ANN202
    """The Jobs client, once the dashboard (which serves the Jobs API) answers."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return cls(address)
        except Exception:  # noqa: BLE001 - not up yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _ready(client, status) -> None:  # noqa: ANN001
    """Wait (untimed) until the cluster's job agent takes a job: the dashboard answers before its agent is up
    ("No available agent to submit job"), so one warm-up job runs to its end before the measured ones."""
    deadline = time.monotonic() + 120
    while True:
        try:
            job = client.submit_job(entrypoint="true")
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    while not client.get_job_status(job).is_terminal():
        if time.monotonic() > deadline:
            raise SystemExit(f"the warm-up ray job {job} did not end within 120 s")
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())

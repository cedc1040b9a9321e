"""GET /v1/jobs/{id} under C concurrent connections, against a bare FastAPI endpoint returning the same JSON.

Starts a private embedded stack with the API's rate limit lifted, runs one
trivial job to completion, then alternates R rounds of D seconds each between
the real API (authentication on every request, the Trainer's GetJob behind it)
and `bench/_bare_api.py` (the same JSON from a bare FastAPI route under the
same uvicorn settings), with `wrk` when it is installed (`--tool wrk`; `make wrk`
unpacks Debian's into the per-user cache, or $TF_WRK_CACHE, which is looked at
before PATH) or an asyncio + httpx load generator in this process (`--tool python`). Prints the
rate and mean latency of each, median and spread over the rounds, and the
ratio real / bare. Usage:

    PYTHONPATH=$PWD .venv/bin/python bench/api_read.py [-c 16] [-d 10] [-r 3] [--tool auto|wrk|python] [-e TF_X=V]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _stack import ROOT, machine_line, spread, stack

from tests import toolcache
from tests.servers import wait_for
from trainforge.sdk import Client

COMMAND = "python -c \"print('hello')\""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _load(url: str, headers: dict, conns: int, seconds: float) -> tuple[float, float, int]:
    """(requests/s answered 200, mean latency s, other answers) over `seconds` with `conns` loops."""
    done, errors, lat = 0, 0, 0.0
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30) as client:
        end = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done, errors, lat
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                r = await client.get(url)
                lat += time.perf_counter() - t0
                if r.status_code == 200:
                    done += 1
                else:
                    errors += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conns)))
        elapsed = time.perf_counter() - t0
    total = done + errors
    return done / elapsed, (lat / total if total else float("nan")), errors


def wrk_path() -> str | None:
    """The wrk `make wrk` unpacked (tools/wrk/setup.sh), else one on PATH, else None."""
    cached = toolcache.where("wrk") / "bin" / "wrk"
    return str(cached) if os.access(cached, os.X_OK) else shutil.which("wrk")


def _wrk(url: str, headers: dict, conns: int, seconds: float) -> tuple[float, float, int]:
    args = [wrk_path() or "wrk", "-t", "2", "-c", str(conns), "-d", f"{max(1, round(seconds))}s", "--latency"]
    for k, v in headers.items():
        args += ["-H", f"{k}: {v}"]
    out = subprocess.run([*args, url], capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    m = re.search(r"Latency\s+([\d.]+)(us|ms|s)", out)
    mean = float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rate, mean, int(bad.group(1)) if bad else 0


def measure(tool: str, url: str, headers: dict, conns: int, seconds: float) -> tuple[float, float, int]:
    if tool == "wrk":
        return _wrk(url, headers, conns, seconds)
    return asyncio.run(_load(url, headers, conns, seconds))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", type=int, default=16, help="concurrent connections")
    ap.add_argument("-d", type=float, default=10.0, help="seconds per round")
    ap.add_argument("-r", type=int, default=3, help="rounds (each: real API, then bare; order flipped each round)")
    ap.add_argument("--tool", choices=("auto", "wrk", "python"), default="auto")
    ap.add_argument("-e", action="append", default=[], metavar="TF_NAME=VALUE",
                    help="a setting for the stack's services (repeatable), e.g. -e TF_JOB_CACHE_SECONDS=0; "
                         "default TF_RATE_LIMIT_PER_SECOND=0")
    args = ap.parse_args()
    tool = args.tool if args.tool != "auto" else ("wrk" if wrk_path() else "python")

    settings = {"TF_RATE_LIMIT_PER_SECOND": "0"}
    for item in args.e:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("TF_"):
            ap.error(f"-e {item!r}: expected TF_NAME=VALUE")
        settings[name] = value

    with stack(settings) as st:
        client = Client(st.api_url, st.api_key)
        job = client.submit({"name": "read", "framework": "custom", "resources": {"cpus": 0.5, "memory": "64Mi"},
                             "command": COMMAND})
        body = wait_for(lambda: (j := client.get(job["id"]))["state"] in ("completed", "failed") and j,
                          120, "job end")
        client.close()
        body_file = Path(tempfile.mkstemp(suffix=".json")[1])
        body_file.write_text(json.dumps(body))
        port = free_port()
        bare = subprocess.Popen([sys.executable, str(ROOT / "bench" / "_bare_api.py"), str(body_file), str(port)],
                                cwd=ROOT)
        try:
            bare_url = f"http://127.0.0.1:{port}/v1/jobs/{job['id']}"
            wait_for(lambda: _up(bare_url), 30, "bare endpoint")
            real_url = f"{st.api_url}/v1/jobs/{job['id']}"
            auth = {"Authorization": f"Bearer {st.api_key}"}
            rounds: dict[str, list[tuple[float, float, int]]] = {"real": [], "bare": []}
            for i in range(args.r):
                order = (("real", real_url, auth), ("bare", bare_url, {}))
                for name, url, headers in (order if i % 2 == 0 else order[::-1]):
                    rounds[name].append(measure(tool, url, headers, args.c, args.d))
        finally:
            bare.terminate()
            bare.wait(10)
            body_file.unlink()

    real_rates = [r for r, _, _ in rounds["real"]]
    bare_rates = [r for r, _, _ in rounds["bare"]]
    ratios = [a / b for a, b in zip(real_rates, bare_rates, strict=True)]
    print(machine_line())
    print(f"GET /v1/jobs/{{id}}, {args.c} connections, {args.r} rounds of {args.d:g} s, load generator: {tool}; "
          f"{' '.join(f'{k}={v}' for k, v in settings.items())}")
    for name, vals in rounds.items():
        print(f"{name:5} req/s {spread([r for r, _, _ in vals])}  mean latency ms "
              f"{spread([m * 1000 for _, m, _ in vals])}  non-200: {sum(e for _, _, e in vals)}")
    print(f"ratio real / bare (of the medians) {statistics.median(real_rates) / statistics.median(bare_rates):.2f}; "
          f"per round {', '.join(f'{r:.2f}' for r in ratios)}")
    return 1 if any(e for vals in rounds.values() for _, _, e in vals) else 0


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    sys.exit(main())

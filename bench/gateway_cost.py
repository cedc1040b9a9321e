"""What the job gateway costs: log shipping through it against straight to the log store, and per job and call.

Starts a private osmem-server, a private SeaweedFS and the API as its own
process (uvicorn, the in-memory Trainer twin holding one running job, the
gateway on), then measures, in alternating rounds (order flipped each round):

  ship    : `LogShipper` tailing a finished N-line archive, lines/s, into the
            log store directly (`LogStore.write_raw`, what a controller did
            before) and through the gateway (`GatewayLogSink`: one POST per
            batch, every line checked, then indexed by the API)
  mint    : `GatewayIssuer.grant` of one plan (the token and the signed
            ticket), microseconds, the LCM's whole per-job cost (revoke is a
            no-op: the gateway asks the Trainer whether the job finished)
  calls   : a 4 KiB object written, looked up and read back: `S3Store`
            straight against SeaweedFS, and `GatewayStore` (a gateway call
            for each, plus the presigned PUT or GET), milliseconds per op

Usage: .venv/bin/python bench/gateway_cost.py [-n 200000] [-r 3] [--batch 2000] [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.log_flood import ship_archive, summary, write_archive  # noqa: E402 - the same archive and summary lines
from tests.servers import free_port, start_osmem, start_seaweedfs, wait_for  # noqa: E402
from trainforge_services.common import jobgateway  # noqa: E402
from trainforge_services.common.adapters.logstore import LogStore  # noqa: E402
from trainforge_services.common.adapters.objectstore.s3 import S3Store  # noqa: E402
from trainforge_services.common.jobgateway import Ticket  # noqa: E402
from trainforge_services.controller.gatewaystore import GatewayClient, GatewayLogSink, GatewayStore  # noqa: E402
from trainforge_services.lcm.lifecycle.gateway_issuer import GatewayIssuer  # noqa: E402

KEY = "bench-gateway-key-" + "b" * 32
JOB, TEAM, BUCKET = "bench-job", "bench", "tf-bench"  # the job and team of log_flood's archive


def serve(port: int, logstore_url: str, index: str, s3: dict) -> None:
    """The API with its gateway, in this process (run as `--serve`)."""
    import uvicorn

    from tests.fakes.trainer_memory import InMemoryTrainer
    from trainforge_services.api.app import create_app
    from trainforge_services.common.settings import ApiSettings

    trainer = InMemoryTrainer()
    trainer.submit_job(team=TEAM, manifest_json='{"name": "b", "framework": "custom", "command": "true"}',
                       code_uri="", submitted_by="bench", job_id=JOB)
    with tempfile.TemporaryDirectory(prefix="tf-bench-gw-") as state:
        objects = S3Store(BUCKET, "gw", create_bucket=True, **s3)
        app = create_app(ApiSettings(dev_mode=True, state_dir=Path(state), credentials_key=KEY, retention_interval=0),
                         trainer=trainer, identity=SimpleNamespace(db=None, close=lambda: None),
                         logs=LogStore(logstore_url, index), objects=objects, audit=object())
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws="none")


def client(url: str) -> GatewayClient:
    k = KEY.encode()
    return GatewayClient(url, JOB, jobgateway.job_token(k, JOB), jobgateway.make_ticket(k, Ticket(JOB, TEAM, ())))


def per_op(store, calls: int, tag: str) -> float:  # noqa: ANN001 - an ObjectStore
    data = os.urandom(4096)
    start = time.perf_counter()
    for i in range(calls):
        key = f"jobs/{JOB}/outputs/0/{tag}-{i}"
        store.put_bytes(key, data)
        store.info(key)
        assert store.get_bytes(key) == data
    return (time.perf_counter() - start) * 1000 / (3 * calls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=200_000, help="log lines per shipping run")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2000, help="lines per batch (the controller's default)")
    ap.add_argument("--calls", type=int, default=200, help="objects written, looked up and read per store and round")
    ap.add_argument("--serve", nargs=4, metavar=("PORT", "LOGSTORE", "INDEX", "S3_ENDPOINT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        port, url, index, endpoint = args.serve
        serve(int(port), url, index, {"endpoint": endpoint, "access_key": os.environ["BENCH_S3_ACCESS"],
                                      "secret_key": os.environ["BENCH_S3_SECRET"]})
        return 0
    print(f"machine : {platform.machine()}, {os.cpu_count()} logical cores, python {platform.python_version()}, "
          "load {:.2f} {:.2f} {:.2f}".format(*psutil.getloadavg()))
    osmem, weed = start_osmem(), start_seaweedfs()
    s3 = {k: weed.extra[k] for k in ("endpoint", "access_key", "secret_key")}
    port = free_port()
    api = subprocess.Popen([sys.executable, __file__, "--serve", str(port), osmem.url, "bench-gw", s3["endpoint"]],
                           env={**os.environ, "BENCH_S3_ACCESS": s3["access_key"], "BENCH_S3_SECRET": s3["secret_key"]})
    url = f"http://127.0.0.1:{port}"
    direct_rates, gateway_rates, mint, direct_ms, gateway_ms = [], [], [], [], []
    try:
        gw = client(url)
        wait_for(lambda: api.poll() is None and _up(gw), 60, "the API with its gateway")
        issuer = GatewayIssuer(KEY.encode(), url)
        plan = SimpleNamespace(job_id=JOB, team=TEAM, reads=("datasets/mnist/", "experiments/e-1/code.tar.gz"))
        direct_store = S3Store(BUCKET, "gw", **s3)
        gateway_store = GatewayStore(client(url))
        with tempfile.TemporaryDirectory(prefix="tf-bench-gw-") as tmp:
            archive = Path(tmp) / "archive.jsonl"
            write_archive(archive, JOB, args.n)
            for r in range(args.rounds):
                for which in (("direct", "gateway") if r % 2 == 0 else ("gateway", "direct")):
                    if which == "direct":
                        store = LogStore(osmem.url, f"bench-direct-{r}")
                        store.ensure_index()
                        direct_rates.append(ship_archive(archive, store, args.n, args.batch))
                        store.close()
                        direct_ms.append(per_op(direct_store, args.calls, f"d{r}"))
                    else:
                        gateway_rates.append(ship_archive(archive, GatewayLogSink(gw, "log"), args.n, args.batch))
                        gateway_ms.append(per_op(gateway_store, args.calls, f"g{r}"))
                    print(f"round {r} {which:<8} done", flush=True)
                start = time.perf_counter()
                for _ in range(10_000):
                    issuer.grant(plan)
                mint.append((time.perf_counter() - start) / 10_000 * 1e6)
        gw.close()
        gateway_store.close()
        direct_store.close()
    finally:
        api.send_signal(signal.SIGTERM)
        api.wait(30)
        osmem.cleanup()
        weed.stop(signal.SIGKILL)
        weed.cleanup()
        for sock in weed.extra["sockets"]:
            sock.unlink(missing_ok=True)
    print(summary("ship straight to the log store", direct_rates, "lines/s"))
    print(summary("ship through the gateway", gateway_rates, "lines/s"))
    print(f"gateway / straight                 {statistics.median(gateway_rates) / statistics.median(direct_rates):.3f}")
    print(summary("GatewayIssuer.grant per job", mint, "us"))
    print(summary("S3Store op (put, info, get)", direct_ms, "ms"))
    print(summary("GatewayStore op (put, info, get)", gateway_ms, "ms"))
    return 0


def _up(gw: GatewayClient) -> bool:
    try:
        gw.call("objects/list", {"prefix": f"jobs/{JOB}/"})
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


if __name__ == "__main__":
    raise SystemExit(main())

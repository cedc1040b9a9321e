"""Checkpoint upload throughput: the verified S3Store.put_file against a plain boto3 upload_file.

Starts a private SeaweedFS (tests.servers.start_seaweedfs), writes a
checkpoint-like file of random bytes, and uploads it N times through
`S3Store.put_file` (local SHA-256 + per-part digests, server-checked SHA-256
checksums, the HEAD that verifies size, metadata and checksum) and N times
through a plain `boto3` `upload_file` of the same file with the same
TransferConfig and the same botocore client settings (no checksums, no
verification), after one untimed warm-up upload of each, interleaved with
the order alternating. Prints MB/s (MB = 10**6 bytes) per run, the
median and best of each with the client's CPU seconds per upload (user+sys
of this process, less sensitive to other load on the machine than wall time),
and the ratio ours/plain of the medians. Usage:

    .venv/bin/python bench/checkpoint_upload.py [-s 256] [-n 3] [--threshold 64] [--chunksize 16]
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

import boto3
import botocore
import psutil
from botocore.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import start_seaweedfs  # noqa: E402
from trainforge_services.common.adapters.objectstore import sha256_file  # noqa: E402
from trainforge_services.common.adapters.objectstore.s3 import S3Store  # noqa: E402

BUCKET = "tf-bench"


def machine(weed: str) -> str:
    freq = psutil.cpu_freq()
    version = subprocess.run([weed, "version"], capture_output=True, text=True, check=False).stdout.strip()
    return "\n".join([
        f"machine : {platform.machine()} {platform.processor() or ''}".rstrip()
        + f", {psutil.cpu_count(logical=False) or '?'} physical / {os.cpu_count()} logical cores"
        + (f" @ {freq.max or freq.current:.0f} MHz" if freq else ""),
        f"memory  : {psutil.virtual_memory().total / 2**30:.1f} GiB RAM, disk under {tempfile.gettempdir()}",
        f"system  : {platform.platform()}",
        f"python  : {platform.python_implementation()} {platform.python_version()}, boto3 {boto3.__version__}, "
        f"botocore {botocore.__version__}",
        f"server  : {version.splitlines()[0] if version else 'weed ?'} on loopback (same machine)",
        "load    : {:.2f} {:.2f} {:.2f} (1/5/15-min load average at start)".format(*psutil.getloadavg()),
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-s", "--size", type=int, default=256, help="checkpoint size in MiB")
    ap.add_argument("-n", "--runs", type=int, default=3, help="uploads of each kind")
    ap.add_argument("--threshold", type=int, default=64, help="multipart threshold in MiB (S3Store default 64)")
    ap.add_argument("--chunksize", type=int, default=0, help="multipart part size in MiB (0: S3Store default)")
    ap.add_argument("--concurrency", type=int, default=8, help="parallel part uploads")
    args = ap.parse_args()

    size = args.size * 2**20
    work = Path(tempfile.mkdtemp(prefix="tf-bench-ckpt-"))
    ckpt = work / "checkpoint.pt"
    with open(ckpt, "wb") as f:
        for _ in range(args.size):
            f.write(os.urandom(2**20))
    # room for 2*N copies: volumes are only reclaimed by vacuum
    server = start_seaweedfs(volume_max=max(16, 2 * args.runs * args.size // 128 + 16), volume_size_limit_mb=256)
    try:
        ex = server.extra
        store = S3Store(BUCKET, "ckpt", endpoint=ex["endpoint"], access_key=ex["access_key"],
                        secret_key=ex["secret_key"], multipart_threshold=args.threshold * 2**20,
                        multipart_chunksize=args.chunksize * 2**20, max_concurrency=args.concurrency,
                        create_bucket=True)
        plain = boto3.client("s3", endpoint_url=ex["endpoint"], aws_access_key_id=ex["access_key"],
                             aws_secret_access_key=ex["secret_key"], region_name="us-east-1",
                             config=Config(s3={"addressing_style": "path"},
                                           retries={"max_attempts": 3, "mode": "standard"},
                                           max_pool_connections=max(10, args.concurrency + 2),
                                           request_checksum_calculation="when_required",
                                           response_checksum_validation="when_required"))
        tc = store.transfer_config
        print(machine(server.argv[0]))
        print(f"file    : {args.size} MiB random bytes, sha256 {sha256_file(ckpt)[:16]}...")
        print(f"transfer: multipart_threshold {tc.multipart_threshold >> 20} MiB, part size "
              f"{tc.multipart_chunksize >> 20} MiB, max_concurrency {tc.max_concurrency}, {args.runs} runs each")
        # untimed warm-up of both paths: the first writes to a bucket make SeaweedFS grow its volumes
        store.put_file("warmup-ours.pt", ckpt)
        plain.upload_file(str(ckpt), BUCKET, "ckpt/warmup-plain.pt", Config=tc)

        def upload_ours(i: int) -> None:
            store.put_file(f"ours-{i}.pt", ckpt)

        def upload_plain(i: int) -> None:
            plain.upload_file(str(ckpt), BUCKET, f"ckpt/plain-{i}.pt", Config=tc)

        me = psutil.Process()
        rates: dict = {upload_ours: [], upload_plain: []}
        cpu: dict = {upload_ours: [], upload_plain: []}
        ours, bare = rates[upload_ours], rates[upload_plain]
        for i in range(args.runs):
            for upload in (upload_ours, upload_plain) if i % 2 == 0 else (upload_plain, upload_ours):
                c0, t0 = sum(me.cpu_times()[:2]), time.perf_counter()  # the order alternates: neither always first
                upload(i)
                rates[upload].append(size / 1e6 / (time.perf_counter() - t0))
                cpu[upload].append(sum(me.cpu_times()[:2]) - c0)
            print(f"run {i + 1}: S3Store.put_file {ours[-1]:7.1f} MB/s   boto3 upload_file {bare[-1]:7.1f} MB/s")
        mo, mb = statistics.median(ours), statistics.median(bare)
        co, cb = statistics.median(cpu[upload_ours]), statistics.median(cpu[upload_plain])
        print(f"S3Store.put_file (verified): median {mo:7.1f} MB/s, best {max(ours):7.1f} MB/s, "
              f"client CPU {co:.2f} s/upload")
        print(f"boto3 upload_file (plain)  : median {mb:7.1f} MB/s, best {max(bare):7.1f} MB/s, "
              f"client CPU {cb:.2f} s/upload")
        print(f"ratio ours/plain (medians) : {mo / mb:.2f}")
        store.close()
        plain.close()
    finally:
        server.stop(signal.SIGKILL)  # throwaway data; a graceful SeaweedFS stop takes ~15 s
        server.cleanup()
        for sock in server.extra["sockets"]:
            sock.unlink(missing_ok=True)
        ckpt.unlink(missing_ok=True)
        work.rmdir()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a job's own etcd user costs: minted at deploy, revoked at cleanup, against the real etcd.

A private etcd with authentication on (bcrypt cost 4, as the embedded stack
and the tests run it) and the LCM's issuer (services/lcm/lifecycle/
etcd_users.py) logged in as root. For each of `-n` jobs: mint its user and
role (`grant`), log in once as that user (what each of its controllers and
its monitor does), revoke it. The baseline, alternated with it in the same
run: a put and a delete of one key (two of etcd's consensus rounds).

    .venv/bin/python bench/etcd_users.py -n 50
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._stack import machine_line, pct  # noqa: E402
from tests import servers  # noqa: E402
from trainforge_services.common.adapters import etcdauth  # noqa: E402
from trainforge_services.common.adapters.etcd import Coordinator  # noqa: E402
from trainforge_services.lcm.lifecycle.etcd_users import EtcdIssuer  # noqa: E402


def ms(values: list[float]) -> str:
    return f"p50 {statistics.median(values) * 1000:.1f} / p99 {pct(values, 99) * 1000:.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=50, help="jobs (default 50)")
    args = ap.parse_args()
    etcd = servers.start_etcd(auth=True)
    try:
        root = Coordinator(etcd.address, "/bench", user=etcdauth.ROOT, password=etcd.extra["root_password"])
        issuer = EtcdIssuer(root, secrets.token_urlsafe(32).encode())
        mint, login, revoke, both, base = [], [], [], [], []
        for i in range(args.n):
            job = f"j{i}"
            t0 = time.perf_counter()
            env = issuer.grant(SimpleNamespace(job_id=job)).controller
            t1 = time.perf_counter()
            c = Coordinator(etcd.address, "/bench", user=env["TF_ETCD_USER"], password=env["TF_ETCD_PASSWORD"])
            c.login()
            t2 = time.perf_counter()
            issuer.revoke(job)
            t3 = time.perf_counter()
            c.close()
            mint.append(t1 - t0)
            login.append(t2 - t1)
            revoke.append(t3 - t2)
            both.append((t1 - t0) + (t3 - t2))
            t0 = time.perf_counter()
            root.put(root.keys.halt(job), {"attempt": 1})
            root.delete(root.keys.halt(job))
            base.append(time.perf_counter() - t0)
        root.close()
    finally:
        etcd.cleanup()
    print(machine_line())
    print(f"jobs: {args.n}")
    print(f"mint + revoke per job: {ms(both)}")
    print(f"  mint (user, role, permission, grant): {ms(mint)}")
    print(f"  revoke (user, role deleted): {ms(revoke)}")
    print(f"  one login as the job's user: {ms(login)}")
    print(f"baseline, a put and a delete of one key: {ms(base)}")
    print(f"ratio mint + revoke / baseline (p50): {statistics.median(both) / statistics.median(base):.2f}")


if __name__ == "__main__":
    main()

"""Run the test node: `python -m tests.kubenode --kubeconfig FILE --name NODE [options]`.

It registers the Node, schedules and runs pods until SIGTERM/SIGINT, then
stops its pods' processes and exits 0. Its log goes to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from tests.kubenode.node import TestNode
from tests.kubenode.rest import Credentials, Kube


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise SystemExit(f"--{what} expects KEY=VALUE, got {v!r}")
        out[key] = val
    return out


def _taint(text: str) -> dict:
    kv, sep, effect = text.rpartition(":")
    key, _, value = kv.partition("=")
    if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute") or not key:
        raise SystemExit(f"--taint expects KEY[=VALUE]:EFFECT (NoSchedule, PreferNoSchedule, NoExecute), got {text!r}")
    return {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.kubenode", description=__doc__)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--name", required=True, help="the Node's name")
    p.add_argument("--workdir", type=Path, required=True, help="pod directories, container logs, the pgid record")
    p.add_argument("--cpu", default="8")
    p.add_argument("--memory", default="32Gi")
    p.add_argument("--pods", default="110")
    p.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu to advertise (0: none)")
    p.add_argument("--label", action="append", default=[], help="KEY=VALUE node label (repeatable)")
    p.add_argument("--taint", action="append", default=[], help="KEY[=VALUE]:EFFECT node taint (repeatable)")
    p.add_argument("--env", action="append", default=[],
                   help="KEY=VALUE in every container's environment, as an image's ENV would be (repeatable)")
    p.add_argument("--no-schedule", action="store_true", help="only run pods bound to this node")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s kubenode %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request would bury the node's own

    allocatable = {"cpu": args.cpu, "memory": args.memory, "pods": args.pods}
    if args.gpus:
        allocatable["nvidia.com/gpu"] = str(args.gpus)
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", **_pairs(args.env, "env")}
    args.workdir.mkdir(parents=True, exist_ok=True)
    kube = Kube(Credentials.from_kubeconfig(args.kubeconfig))
    node = TestNode(kube, args.name, allocatable, _pairs(args.label, "label"), [_taint(t) for t in args.taint],
                    args.workdir, base_env, schedule=not args.no_schedule)
    failed: list[BaseException] = []

    def loop() -> None:
        try:
            node.run()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread, which exits non-zero
            failed.append(e)
            logging.exception("the test node's loop failed")
            node.stop_event.set()

    signal.signal(signal.SIGTERM, lambda *_: node.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: node.stop_event.set())
    # the watch blocks in a read; the main thread only waits for a signal, then shuts the pods down
    threading.Thread(target=loop, name="watch", daemon=True).start()
    while not node.stop_event.wait(1):
        pass
    node.shutdown()
    kube.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

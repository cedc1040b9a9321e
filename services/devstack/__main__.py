"""`python -m trainforge_services.devstack up|down|status|bootstrap --state-dir DIR [--json]`.

With `--json` stdout is JSON Lines, one object per line, flushed as they
happen so the CLI can show progress: `{"component": {...}}` for each
component as it starts or stops, then `{"result": {...}}` (exit 0) or
`{"error": {"message": ...}}` (exit 1). Without it, the same as plain text.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from trainforge_services.devstack import launcher
from trainforge_services.devstack.components import ComponentStatus, StackError


def _emit(as_json: bool, kind: str, body: Any, text: str) -> None:
    if as_json or text:
        print(json.dumps({kind: body}) if as_json else text, flush=True)


def _component(as_json: bool) -> launcher.Report:
    def report(s: ComponentStatus) -> None:
        pid = f"pid {s.pid}" if s.pid else ""
        _emit(as_json, "component", s.to_json(), f"{s.name:<10} {pid:<11} {s.address:<28} {s.status.value}"
                                                  + (f"  {s.detail}" if s.detail else ""))
    return report


def _run(args: argparse.Namespace) -> None:
    j = args.json
    if args.command == "up":
        info = launcher.up(args.state_dir, report=_component(j), timeout=args.timeout, replicas=args.replicas)
        _emit(j, "result", info.to_json(), f"API {info.api_url}  team {info.team}  stack {info.stack_id}\n"
                                           f"{info.isolation}")
    elif args.command == "down":
        statuses = launcher.down(args.state_dir, report=_component(j), grace=args.grace)
        _emit(j, "result", {"state_dir": str(args.state_dir), "components": [s.to_json() for s in statuses]},
              f"stopped {len(statuses)} processes" if statuses else f"no stack in {args.state_dir}")
    elif args.command == "status":
        statuses = launcher.status(args.state_dir)
        for s in statuses:
            _component(j)(s)
        _emit(j, "result", {"state_dir": str(args.state_dir), "components": [s.to_json() for s in statuses]}, "")
    else:
        issued = launcher.bootstrap_admin(args.state_dir, args.team, args.name)
        _emit(j, "result", issued.to_json(), issued.key)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainforge_services.devstack", description="the embedded trainforge stack")
    sub = p.add_subparsers(dest="command", required=True)

    def cmd(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--state-dir", required=True, help="where pids, logs, data and stack.json live")
        sp.add_argument("--json", action="store_true", help="JSON Lines for the CLI")
        return sp

    u = cmd("up", "start what is not running, wait until healthy, ensure an API key")
    u.add_argument("--timeout", type=float, default=150.0, help="seconds to wait for the stack to be healthy")
    u.add_argument("--replicas", type=int, default=None,
                   help="API, Trainer and LCM processes each (default: as running, else 1)")
    cmd("down", "stop everything the stack started").add_argument(
        "--grace", type=float, default=20.0, help="seconds between SIGTERM and SIGKILL")
    cmd("status", "which components run and are healthy")
    b = cmd("bootstrap", "issue a platform_admin key (team created if missing)")
    b.add_argument("--team", required=True)
    b.add_argument("--name", default="bootstrap", help="label of the key")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        _run(args)
    except StackError as e:
        if args.json:
            _emit(True, "error", {"message": e.message}, "")
        print(f"error: {e.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The embedded stack, from the CLI's side: runs the launcher as a process and reads its JSON.

The launcher (`python -m trainforge_services.devstack`) lives with the services, which
the CLI must not import; `trainforge up` / `down` / `admin bootstrap` start
it with this interpreter and read its JSON Lines as they come (one
`{"component": ...}` per component, then `{"result": ...}` or
`{"error": ...}`), so the spinner can follow along. Everything else the CLI
does goes over the REST API.

A client-only install (`pip install trainforge`) has the services' code but
not their dependencies: the launcher then dies importing one, and the user
is told, in one line, to install the server extra rather than shown a
traceback.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Statuses that mean the component is where it should be (the launcher's Status values).
OK_STATUSES = frozenset({"started", "running", "stopped"})
_MODULE = "trainforge_services.devstack"
SERVER_EXTRA = "the embedded stack needs the server extra: pip install 'trainforge[server]'"
# The last line of a launcher that could not import the services or one of their dependencies.
_MISSING = re.compile(r"^ModuleNotFoundError: No module named '([^']+)'")


class StackError(Exception):
    """The stack could not be started or stopped; the message says which part and where its log is."""


OnComponent = Callable[[dict], None]


def _ignore(_: dict) -> None:
    pass


def run(command: str, state: Path, *args: str, on_component: OnComponent = _ignore) -> dict:
    """`python -m trainforge_services.devstack COMMAND --state-dir STATE ARGS --json`; its result, or StackError."""
    # -P: the current directory must not shadow the platform's packages.
    argv = [sys.executable, "-P", "-m", _MODULE, command, "--state-dir", str(state), *args, "--json"]
    result: dict | None = None
    error = ""
    # stderr to a file: a pipe nobody reads while we follow stdout could fill and stall the launcher
    with tempfile.TemporaryFile("w+") as err_file:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=err_file, text=True)
        except OSError as e:
            raise StackError(f"cannot run the stack launcher `python -m {_MODULE}`: {e}") from None
        with proc:
            for line in proc.stdout or ():
                msg = _parse(line)
                if "component" in msg:
                    on_component(msg["component"])
                elif "result" in msg:
                    result = msg["result"]
                elif "error" in msg:
                    error = str(msg["error"].get("message", "")) if isinstance(msg["error"], dict) \
                        else str(msg["error"])
        err_file.seek(0)
        stderr = err_file.read()
    if error:
        raise StackError(error)
    if proc.returncode != 0 or result is None:
        # the launcher did not get as far as saying what went wrong (a crash, a missing package)
        tail = stderr.strip().splitlines()
        missing = _MISSING.match(tail[-1]) if tail else None
        if missing:
            raise StackError(f"{SERVER_EXTRA} (missing: {missing.group(1)})")
        raise StackError(f"`python -m {_MODULE} {command}` failed: "
                         f"{tail[-1] if tail else f'exit status {proc.returncode}'}")
    return result


def _parse(line: str) -> dict[str, Any]:
    try:
        msg = json.loads(line)
    except ValueError:
        return {}
    return msg if isinstance(msg, dict) else {}


def up(state: Path, *, timeout: float = 150.0, on_component: OnComponent = _ignore,
       replicas: int | None = None) -> dict:
    """Start whatever of the embedded stack is not running; {stack_id, api_url, team, key_created, components}.

    `replicas`: API, Trainer and LCM processes each (None: as the running stack has, else 1).
    """
    extra = ("--replicas", str(replicas)) if replicas is not None else ()
    return run("up", state, "--timeout", str(timeout), *extra, on_component=on_component)


def down(state: Path, *, grace: float = 20.0, on_component: OnComponent = _ignore) -> list[dict]:
    """Stop everything `up` started; one entry per process stopped."""
    return run("down", state, "--grace", str(grace), on_component=on_component)["components"]


def bootstrap_admin(state: Path, team: str, name: str = "bootstrap") -> dict:
    """A platform_admin key for `team`: {team, key, key_id, role}; against the embedded stack of
    `state` when there is one, else the platform the TF_* environment names."""
    return run("bootstrap", state, "--team", team, "--name", name)

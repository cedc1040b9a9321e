"""Holding a prestarted trial inside its own Python interpreter (docs/EXPERIMENTS.md, "Prestarted trials").

A held learner's process (the guard, or the sandbox's entry) normally blocks
on the hold pipe just before it starts `/bin/sh -c <command>`; once the gate
opens, the shell and the trial's interpreter still have to start (about
40 ms on a quiet machine, 100-300 ms while the slot's other hand-over work
runs beside it). For a command that is nothing but a Python interpreter
running the user's program, the hold can move into that interpreter: the
held process starts the command at once and hands the hold pipe on
(`--pass-hold`), and the learners' start-up hook
(services/controller/pyhook/sitecustomize.py) blocks on it before anything
of the user's runs. A byte starts the program; end-of-file exits with
guard.EXIT_NOT_STARTED, as the held process would have.

That is only sound when nothing of the user's can run before the hook:
`holds_itself` says so for a command that is exactly one simple command whose
program is a Python 3 interpreter binary (`python`, `python3`, `python3.N`,
found on the learner's PATH or named by path) with the hook first on the
learner's PYTHONPATH, and no interpreter option that skips the hook (-I, -E,
-S). Anything else - `cd x && python ...`, `pip install ...; python ...`,
a variable assignment or a command substitution, a redirection, a wrapper
script named python, an unknown option - is held by the process as before.
What does run before the hook is the interpreter's own `site` start-up: the
`.pth` files of the environment it runs in (the platform's, or the job's
own `requirements:` environment, which the platform built before the trial
was held), never the user's command or program.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Mapping

from .linebuf import HOOK_DIR

# The variable naming the hold pipe's read end in the held command's environment; the hook takes it out
# before the user's program runs. The same name is spelled in guard.py, sandbox/enter.py and the hook,
# which import nothing of the platform's.
HOLD_FD_ENV = "TF_LEARNER_HOLD_FD"

_PYTHON = re.compile(r"python(3(\.\d+)?)?")
# Options taking a value in the next argument (or the rest of this one).
_WITH_VALUE = frozenset("XW")
# Options that skip the hook: -I (isolated: implies -E, -s), -E (ignores PYTHONPATH), -S (no `site`); and
# those that print and exit before `site` runs (-h, -?, -V), which would end a held learner at once.
_SKIPS_HOOK = frozenset("IESh?V")
# Unquoted, these make the line more than one simple command (a list, a pipeline, a subshell, a
# redirection); a command substitution ($(...) or backquotes) runs something even inside double quotes.
_OPERATORS = frozenset(";&|<>()`\n")


def holds_itself(command: str, env: Mapping[str, str]) -> bool:
    """Whether `command`, run by `/bin/sh -c` with `env`, is a Python interpreter that the start-up hook can
    hold before any of the user's code runs (the module's docstring says when)."""
    if not _one_simple_command(command):
        return False
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: the shell will say what is wrong, unheld
        return False
    if not words or "$" in words[0] or not _PYTHON.fullmatch(os.path.basename(words[0])):
        return False
    if not _hook_on_path(env):
        return False
    program = words[0] if "/" in words[0] else shutil.which(words[0], path=env.get("PATH", ""))
    return program is not None and _is_binary(program) and not skips_hook(words)


def skips_hook(argv: list[str]) -> bool:
    """Whether the interpreter's own options (before -c, -m, the script or `-`) include one that skips the
    hook (-I, -E, -S) or exits before it runs (-h, -?, -V, --help, --version), or a long option this parser
    does not know well enough to be sure it does neither."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "--":
            return False
        if arg.startswith("--"):
            if arg in ("--check-hash-based-pycs",):
                next(args, None)
                continue
            return True  # --help, --version, an option of a newer interpreter: nothing to hold
        if not arg.startswith("-") or arg == "-":
            return False  # the script (or stdin): what follows is the program's
        for i, flag in enumerate(arg[1:], start=2):
            if flag in _SKIPS_HOOK:
                return True
            if flag in "cm":
                return False  # the rest is the command or the module: the interpreter's options ended
            if flag in _WITH_VALUE:
                if i == len(arg):
                    next(args, None)
                break
    return False


def _one_simple_command(command: str) -> bool:
    """Whether the shell would run `command` as one simple command with nothing substituted: no operator
    outside quotes, no command substitution outside single quotes, the quotes closed. Where the shell's
    rules are subtler (an escaped character), it errs on the side of False."""
    quote, i = "", 0
    while i < len(command):
        c = command[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            i += 1  # the next character is taken literally (in double quotes only some are; refusing more is safe)
        elif quote == '"':
            if c == '"':
                quote = ""
            elif c == "`" or command.startswith("$(", i):
                return False
        elif c in "'\"":
            quote = c
        elif c in _OPERATORS or command.startswith("$(", i):
            return False
        i += 1
    return not quote


def _hook_on_path(env: Mapping[str, str]) -> bool:
    path = env.get("PYTHONPATH", "").split(os.pathsep)
    return bool(path) and path[0] == str(HOOK_DIR)


def _is_binary(path: str) -> bool:
    """An executable ELF file (through symlinks): an interpreter, not a wrapper script that could run
    something of its own first."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF" and os.access(path, os.X_OK)
    except OSError:
        return False

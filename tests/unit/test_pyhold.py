"""A prestarted trial held inside its own Python interpreter (services/controller/pyhold.py): which commands
can be, and the learners' start-up hook and the guard holding a real interpreter on a real pipe."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.servers import blocked_on_a_pipe, wait_for
from trainforge_services.controller import guard
from trainforge_services.controller.learner import GUARD
from trainforge_services.controller.linebuf import with_hook
from trainforge_services.controller.pyhold import HOLD_FD_ENV, holds_itself, skips_hook
from trainforge_services.controller.sandbox import enter

BIN = str(Path(sys.executable).parent)


def learner_env(path: str = BIN) -> dict[str, str]:
    """As the controller makes it: the platform's interpreter first on PATH, the hook first on PYTHONPATH."""
    return with_hook({"PATH": f"{path}:/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}, {})


@pytest.mark.parametrize("command", [
    "python train.py",
    "python -c 'import time; time.sleep(1)'",
    "python3 train.py --lr 0.1 -S -E",  # after the script: the program's own arguments
    f"{sys.executable} -u -X importtime -c pass",
    "python -W ignore train.py",
    "python -Wignore -m pkg.train",
    "python -m torch.distributed.run --nproc-per-node 2 train.py",
    "python -c 'import sys; print(sys.argv[1:] or \"a|b\")' '$(not run)' \"x > y\"",  # quoted: words
    "python -c 'import time\ntime.sleep(1)'",  # a newline inside quotes
    "python train.py \\; rm x",  # an escaped operator is a word: python gets ";", "rm", "x"
    "python train.py --lr $LR",  # the shell expands it; nothing runs
    "  python   train.py  ",
])
def test_a_bare_python_command_holds_itself(command):
    assert holds_itself(command, learner_env()), command


@pytest.mark.parametrize("command", [
    "python -I train.py", "python -S train.py", "python -E train.py", "python -uS train.py", "python -IX dev x.py",
    "python -W ignore -S train.py", "python -X dev -E train.py", "python -V", "python --version", "python -h",
    "python --some-new-option train.py",
    "cd sub && python train.py", "python train.py; echo done", "python train.py || true", "python train.py | tee x",
    "python train.py > out.txt", "python < train.py", "(python train.py)", "python $(echo train).py",
    "python `echo train`.py", "LR=1 python train.py", "exec python train.py", "bash -c 'python train.py'",
    "python2 train.py", "python.5 train.py", "pythonw train.py", "$PY train.py", "python 'unbalanced",
    "python train.py\npython eval.py", "", "torchrun train.py", "python -c \"$(rm -rf x)\"",
    "python -c \"`id`\"", "python -c 'ok' &",
])
def test_anything_else_is_held_by_the_process(command):
    assert not holds_itself(command, learner_env()), command


def test_not_without_the_hook_first_on_the_path_or_without_an_interpreter_binary(tmp_path):
    no_hook = {"PATH": f"{BIN}:/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}  # the manifest chose its own buffering
    assert not holds_itself("python train.py", no_hook)
    assert not holds_itself("python train.py", {**learner_env(), "PYTHONPATH": f"/elsewhere:{learner_env()['PYTHONPATH']}"})
    assert not holds_itself("python train.py", learner_env(path=str(tmp_path)) | {"PATH": str(tmp_path)})
    wrapper = tmp_path / "python"  # a script that could run something of its own before any interpreter
    wrapper.write_text("#!/bin/sh\necho before\nexec python3 \"$@\"\n")
    wrapper.chmod(0o755)
    assert not holds_itself("python train.py", learner_env(path=str(tmp_path)))
    assert not holds_itself(f"{wrapper} train.py", learner_env())
    assert holds_itself(f"{os.path.realpath(sys.executable)} train.py", learner_env())


@pytest.mark.parametrize(("argv", "skips"), [
    (["python", "x.py", "-S"], False), (["python", "-c", "pass", "-I"], False), (["python", "-mI"], False),
    (["python", "-X", "-S", "x.py"], False),  # -S is -X's value here
    (["python", "-XS", "-E", "x.py"], True), (["python", "-bbE", "x.py"], True), (["python", "--", "-S"], False),
    (["python", "-", "-S"], False), (["python", "--check-hash-based-pycs", "always", "-S"], True),
])
def test_the_interpreters_options_end_where_its_program_begins(argv, skips):
    assert skips_hook(argv) is skips


def test_the_three_files_that_cannot_import_it_spell_the_variable_alike():
    hook = (Path(__file__).parents[2] / "services/controller/pyhook/sitecustomize.py").read_text()
    assert guard.HOLD_FD_ENV == enter.HOLD_FD_ENV == HOLD_FD_ENV
    assert f'_HOLD_FD_ENV = "{HOLD_FD_ENV}"' in hook
    assert f"_NOT_STARTED = {guard.EXIT_NOT_STARTED}" in hook and enter.EXIT_NOT_STARTED == guard.EXIT_NOT_STARTED


PROGRAM = """
import os, sys, time
open("started", "w").write(repr(time.time()))
try:
    os.fstat({fd})
    fd_open = True
except OSError:
    fd_open = False
print("started", os.environ.get("{var}"), fd_open, flush=True)
"""


class Held:
    """A held interpreter running PROGRAM in a folder: alone (the hold named in its environment, as a guard
    or a sandbox's pid 1 leaves it) or under the real guard with --pass-hold and a lifeline, behind a shell."""

    def __init__(self, cwd: Path, how: str, fd_value: str | None = None):
        r, self.hold = os.pipe()
        lifeline_r, self.lifeline = os.pipe()
        env = learner_env()
        code = PROGRAM.format(fd=r, var=HOLD_FD_ENV)
        if how == "interpreter":
            env[HOLD_FD_ENV] = fd_value if fd_value is not None else str(r)
            argv = [sys.executable, "-c", code]
        else:
            argv = [sys.executable, "-I", "-S", str(GUARD), str(lifeline_r), "--pass-hold", str(r),
                    "/bin/sh", "-c", f"python -c '{code}'"]
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, pass_fds=(r, lifeline_r), start_new_session=True)
        os.close(r)
        os.close(lifeline_r)

    def interpreter(self) -> int:
        """The pid of the interpreter running PROGRAM (under the guard, the shell's child or the shell itself
        exec'd), 0 while there is none."""
        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            return 0
        for p in procs:
            try:
                argv = p.cmdline()
            except psutil.Error:
                continue
            if os.path.basename(argv[0]).startswith("python") and argv[1:2] == ["-c"] and 'open("started"' in argv[2]:
                return p.pid
        return 0

    def wait_held(self) -> None:
        wait_for(lambda: (pid := self.interpreter()) and blocked_on_a_pipe(pid), 30,
                 "the interpreter to block on its hold pipe")

    def close(self) -> None:
        for fd in (self.hold, self.lifeline):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.mark.parametrize("how", ["interpreter", "guard"])
def test_a_held_interpreter_runs_the_program_only_once_released(tmp_path, how):
    held = Held(tmp_path, how)
    try:
        held.wait_held()
        assert not (tmp_path / "started").exists()
        released = time.time()
        os.write(held.hold, b"\n")
        out, err = held.proc.communicate(timeout=30)
        assert held.proc.returncode == 0, err
        # the program ran after the release, and saw neither the hold's variable nor its pipe
        assert float((tmp_path / "started").read_text()) >= released
        assert out.splitlines() == ["started None False"], (out, err)
    finally:
        held.close()


@pytest.mark.parametrize("how", ["interpreter", "guard"])
def test_a_hold_given_up_exits_125_without_running_the_program(tmp_path, how):
    held = Held(tmp_path, how)
    try:
        held.wait_held()
        os.close(held.hold)  # what give_up_hold does
        out, err = held.proc.communicate(timeout=30)
        assert held.proc.returncode == guard.EXIT_NOT_STARTED, err
        assert out == "" and not (tmp_path / "started").exists()
    finally:
        held.close()


def test_a_hold_that_cannot_be_read_never_runs_the_program(tmp_path):
    held = Held(tmp_path, "interpreter", fd_value="not-a-number")
    try:
        out, err = held.proc.communicate(timeout=30)
    finally:
        held.close()
    assert held.proc.returncode == guard.EXIT_NOT_STARTED
    assert "trainforge: the learner could not be held (ValueError" in err and "not starting it" in err
    assert out == "" and not (tmp_path / "started").exists()


def test_the_hook_parses_as_older_pythons_would_parse_it():
    # an interpreter that could not parse the hook would run a held program unheld (no f-strings, no walrus)
    hook = Path(__file__).parents[2] / "services/controller/pyhook/sitecustomize.py"
    ast.parse(hook.read_text(), feature_version=(3, 5))

"""The learners' start-up hook (services/controller/pyhook/sitecustomize.py): one write(2) per printed line.

Each test runs a real interpreter with the hook first on its PYTHONPATH, as
the controller starts a learner, and looks at what reached the pipe; the
write counts come from strace.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.controller.learner import learner_env
from trainforge_services.controller.linebuf import HOOK_DIR, with_hook

PRINTS = "import sys\nfor i in range({n}):\n    print(f'line {{i}}')\n    print(f'err {{i}}', file=sys.stderr)\n"


def hook_env(**extra: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1", **extra}
    return with_hook(env, {})


def run_py(code: str, env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def writes_per_fd(tmp_path: Path, code: str, env: dict[str, str], *args: str) -> tuple[dict[int, int], str]:
    """How many write(2) calls the interpreter made to fd 1 and fd 2, and its stdout (a pipe)."""
    strace = shutil.which("strace")
    assert strace, "strace is needed to count the learner's write(2) calls"
    trace = tmp_path / "trace"
    out = subprocess.run([strace, "-qq", "-e", "trace=write", "-o", str(trace), sys.executable, *args, "-c", code],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    counts = {1: 0, 2: 0}
    for line in trace.read_text().splitlines():
        for fd in counts:
            if line.startswith(f"write({fd}, "):
                counts[fd] += 1
    return counts, out.stdout


def test_print_makes_one_write_per_line_on_a_pipe_and_two_without_the_hook(tmp_path):
    code = PRINTS.format(n=200)
    counts, stdout = writes_per_fd(tmp_path, code, hook_env())
    assert counts == {1: 200, 2: 200}
    assert stdout.splitlines() == [f"line {i}" for i in range(200)]
    before, _ = writes_per_fd(tmp_path, code, {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"})
    assert before == {1: 400, 2: 400}  # what PYTHONUNBUFFERED alone does: the text, then "\n"


SHOW = ("import os, sys\nprint(sys.stdout.line_buffering, sys.stdout.write_through, sys.stderr.line_buffering,"
        " sys.stderr.write_through, file=sys.stderr)\n")


@pytest.mark.parametrize(("args", "env_extra", "expected"), [
    ((), {}, "True False True False"),  # the hook's work
    (("-u",), {}, "False True False True"),  # asked for write-through on the command line
    (("-Bu",), {}, "False True False True"),
    (("-X", "utf8", "-u"), {}, "False True False True"),
    ((), {"PYTHONUNBUFFERED": ""}, "False False True False"),  # buffered, as the interpreter makes it
])
def test_the_hook_leaves_alone_what_the_learner_chose(args, env_extra, expected):
    out = run_py(SHOW, hook_env(**env_extra), *args)
    assert out.returncode == 0 and out.stderr.strip() == expected, out.stderr


def test_streams_that_are_not_pipes_are_left_write_through(tmp_path):
    with open(tmp_path / "out", "w") as f:
        subprocess.run([sys.executable, "-c", SHOW.replace("file=sys.stderr", "file=sys.stdout")], env=hook_env(),
                       stdout=f, stderr=subprocess.DEVNULL, timeout=60, check=True)
    assert (tmp_path / "out").read_text().split()[:2] == ["False", "True"]


def test_a_carriage_return_reaches_the_pipe_at_once_and_a_partial_line_at_exit():
    # The learner waits on its stdin (closed by us only once the progress line was read).
    code = ("import sys\nsys.stdout.write('progress 1/2\\r')\nsys.stdin.readline()\n"
            "sys.stdout.write('no newline at exit')\n")
    with subprocess.Popen([sys.executable, "-c", code], env=hook_env(), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE) as proc:
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            assert ready, "the progress line did not reach the pipe"
            got = os.read(proc.stdout.fileno(), 100)
            assert got == b"progress 1/2\r"
            proc.stdin.close()
            assert proc.stdout.read() == b"no newline at exit"
            assert proc.wait(30) == 0
        finally:
            proc.kill()


def test_a_fork_does_not_print_a_pending_partial_line_twice():
    code = ("import os, sys\nprint('partial', end='')\npid = os.fork()\n"
            "if pid == 0:\n    print(' child')\n    sys.exit(0)\n"
            "os.waitpid(pid, 0)\nprint(' parent')\n")
    out = run_py(code, hook_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("partial") == 1 and sorted(out.stdout.split()) == ["child", "parent", "partial"]


def test_a_users_sitecustomize_still_runs_and_the_hook_leaves_sys_path(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.user_customized = True\n")
    code = ("import os, sys\nimport sitecustomize\n"
            "print(getattr(sys, 'user_customized', False), sitecustomize.__file__)\n"
            f"print({str(HOOK_DIR)!r} in sys.path, os.environ['PYTHONPATH'])\n"
            "print(sys.stdout.line_buffering)\n")
    out = run_py(code, hook_env(PYTHONPATH=str(site)) | {"PYTHONPATH": f"{HOOK_DIR}:{site}"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"True {site / 'sitecustomize.py'}",
                                       f"False {HOOK_DIR}:{site}",  # children get the hook through the variable
                                       "True"]


def test_an_error_in_the_users_sitecustomize_is_reported_as_before(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("raise RuntimeError('user hook broke')\n")
    out = run_py("print('ran')", hook_env(PYTHONPATH=str(tmp_path)) | {"PYTHONPATH": f"{HOOK_DIR}:{tmp_path}"})
    assert out.returncode == 0 and out.stdout == "ran\n"
    assert "Error in sitecustomize" in out.stderr and "user hook broke" in out.stderr


def spec(tmp_path, env: dict[str, str]) -> LearnerSpec:
    return LearnerSpec.model_validate({
        "job_id": "j1", "team": "t", "attempt": 1, "rank": 0, "world_size": 1,
        "manifest": {"name": "m", "command": "python train.py", "env": env},
        "workdir": str(tmp_path / "learner-0"), "master_addr": "127.0.0.1", "master_port": 29611, "gpu_ids": [],
        "lease_ttl": 6, "code_uri": "", "checkpoint_uri": ""})


def test_the_learner_env_puts_the_hook_first_unless_the_manifest_sets_pythonunbuffered(tmp_path):
    assert learner_env(spec(tmp_path, {}), base={})["PYTHONPATH"] == str(HOOK_DIR)
    env = learner_env(spec(tmp_path, {"PYTHONPATH": "libs:/opt/x"}), base={"PYTHONPATH": "/controller"})
    assert env["PYTHONPATH"] == f"{HOOK_DIR}:libs:/opt/x" and env["PYTHONUNBUFFERED"] == "1"
    for chosen in ("1", ""):
        env = learner_env(spec(tmp_path, {"PYTHONUNBUFFERED": chosen, "PYTHONPATH": "libs"}), base={})
        assert env["PYTHONUNBUFFERED"] == chosen and env["PYTHONPATH"] == "libs"
    assert sorted(p.name for p in HOOK_DIR.iterdir() if p.name != "__pycache__") == ["sitecustomize.py"]

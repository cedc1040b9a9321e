"""The learner spec, the learner's environment, and the learner process with its memory watchdog."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil
import pytest

from tests.servers import wait_for
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.controller import guard
from trainforge_services.controller.learner import (
    GUARD,
    LearnerProcess,
    MemoryWatchdog,
    describe_exit,
    exit_code_of,
    guarded_argv,
    human_bytes,
    learner_env,
)
from trainforge_services.controller.linebuf import HOOK_DIR
from trainforge_services.controller.logship import LogArchive


def spec_dict(tmp_path, **kw) -> dict:
    manifest = {"name": "m", "command": "python train.py --lr {{lr}}", "params": {"lr": 0.1},
                "resources": {"cpus": 2.5, "memory": "1Gi"}, "env": {"MY_VAR": "x", "RANK": "99",
                                                                     "OMP_NUM_THREADS": "7", "TF_STACK_ID": "no"}}
    return {"job_id": "j1", "team": "t", "attempt": 2, "rank": 1, "world_size": 2, "manifest": manifest,
            "workdir": str(tmp_path / "learner-1"), "master_addr": "127.0.0.1", "master_port": 29611,
            "gpu_ids": [2, 3], "lease_ttl": 6, "code_uri": "", "checkpoint_uri": "", "added_later": True} | kw


def test_load_spec_reads_the_contract_file(tmp_path):
    path = tmp_path / "learner-1.json"
    path.write_text(json.dumps(spec_dict(tmp_path)))
    spec = LearnerSpec.load(path)
    assert (spec.job_id, spec.rank, spec.world_size, spec.attempt, spec.lease_ttl) == ("j1", 1, 2, 2, 6)
    assert spec.manifest.rendered_command() == "python train.py --lr 0.1"
    assert spec.archive_path == tmp_path / "learner-1-2.log.jsonl"
    assert spec.outputs_prefix == "jobs/j1/outputs/1/" and spec.log_key == "jobs/j1/logs/1-2.jsonl"


@pytest.mark.parametrize(("change", "message"), [
    ({"rank": 2}, "rank 2 must be less than world_size 2"),
    ({"workdir": "relative/dir"}, "must be an absolute path"),
    ({"job_id": ""}, "job_id"),
    ({"manifest": {"name": "Bad Name", "command": "x"}}, "manifest.name"),
])
def test_load_spec_names_every_bad_field(tmp_path, change, message):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec_dict(tmp_path) | change))
    with pytest.raises(InvalidArgument, match=message):
        LearnerSpec.load(path)


def test_load_spec_unreadable(tmp_path):
    with pytest.raises(InvalidArgument, match="cannot read learner spec"):
        LearnerSpec.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InvalidArgument, match="is not valid JSON"):
        LearnerSpec.load(tmp_path / "bad.json")


def test_learner_env_follows_the_contract(tmp_path):
    spec = LearnerSpec.model_validate(spec_dict(tmp_path))
    base = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "LC_ALL": "C.UTF-8", "TF_S3_SECRET_KEY": "secret",
            "AWS_SECRET_ACCESS_KEY": "secret", "PYTHONPATH": "/somewhere", "TF_STACK_ID": "stack-1"}
    env = learner_env(spec, base=base, python="/opt/tf/venv/bin/python")
    w = spec.workdir
    assert env == {
        "HOME": "/home/u", "LC_ALL": "C.UTF-8", "TF_STACK_ID": "stack-1",
        "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "7", "MY_VAR": "x",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611", "RANK": "1", "WORLD_SIZE": "2",
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "TF_JOB_ID": "j1", "TF_RANK": "1", "TF_ATTEMPT": "2", "TF_WORKDIR": str(w),
        "TF_CHECKPOINT_DIR": str(w / ".trainforge" / "checkpoints"), "TF_OUTPUT_DIR": str(w / "outputs"),
        "TF_CHECKPOINT_INTERVAL": "300",
        "CUDA_VISIBLE_DEVICES": "2,3", "PATH": "/opt/tf/venv/bin:/usr/bin:/bin",
        "PYTHONPATH": str(HOOK_DIR),  # the platform's line-buffering hook; the controller's PYTHONPATH is not passed
    }


def test_learner_env_defaults(tmp_path):
    d = spec_dict(tmp_path, gpu_ids=[])
    d["manifest"] = {"name": "m", "command": "true", "resources": {"cpus": 0.5}, "checkpoint": {"interval": "1.5s"}}
    env = learner_env(LearnerSpec.model_validate(d), base={}, python="/py/bin/python")
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["TF_CHECKPOINT_INTERVAL"] == "1.5"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["PATH"] == "/py/bin:/usr/local/bin:/usr/bin:/bin"


def test_exit_codes_and_sizes():
    assert exit_code_of(0) == 0 and exit_code_of(3) == 3
    assert exit_code_of(-signal.SIGKILL) == 137 and exit_code_of(-signal.SIGTERM) == 143
    assert describe_exit(3) == "learner exited with code 3"
    assert describe_exit(-9) == "learner was killed by SIGKILL (exit code 137)"
    assert [human_bytes(n) for n in (512, 1536, 300 * 2**20, 2 * 2**30, 3 * 2**40)] == [
        "512B", "1.5Ki", "300.0Mi", "2.0Gi", "3.0Ti"]


def test_learner_output_is_numbered_across_streams(tmp_path):
    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    learner = LearnerProcess("echo out; echo err >&2; printf 'no newline'", tmp_path, {"PATH": "/usr/bin:/bin"},
                             archive)
    learner.start()
    assert learner.wait(10) == 0
    assert learner.finish_output(10)
    archive.close()
    docs = [json.loads(raw) for raw in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert sorted(d["seq"] for d in docs) == [1, 2, 3]
    assert {(d["stream"], d["line"]) for d in docs} == {("stdout", "out"), ("stderr", "err"),
                                                        ("stdout", "no newline")}


def test_watchdog_kills_the_process_group_over_its_memory_limit(tmp_path):
    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    hog = f"{sys.executable} -c \"import time; b = b'x' * (200 * 2**20); print('allocated', flush=True); time.sleep(60)\""
    learner = LearnerProcess(f"{hog} & wait", tmp_path, {"PATH": "/usr/bin:/bin"}, archive)
    learner.start()
    exceeded: list[str] = []
    watchdog = MemoryWatchdog(learner, 100 * 2**20, interval=0.1, on_exceeded=exceeded.append).start()
    returncode = learner.wait(30)
    watchdog.stop()
    assert returncode == -signal.SIGKILL
    assert exceeded and exceeded[0].startswith("memory limit exceeded: ")
    assert exceeded[0].endswith(" > 100.0Mi")
    assert learner.finish_output(10), "the grandchild died with the group, closing the pipes"
    archive.close()


def started(tmp_path, command: str, *, held: bool = False) -> tuple[LearnerProcess, LogArchive]:
    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    learner = LearnerProcess(command, tmp_path, {"PATH": "/usr/bin:/bin"}, archive, held=held)
    learner.start()
    return learner, archive


def lines(tmp_path) -> list[str]:
    return [json.loads(raw)["line"] for raw in (tmp_path / "a.jsonl").read_text().splitlines()]


def group(pgid: int) -> list[psutil.Process]:
    """The live (not zombie) processes of a process group."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def test_the_learner_runs_under_the_guard_with_the_platform_interpreter():
    argv = guarded_argv("python train.py --lr 0.1", 7, python="/opt/tf/bin/python")
    assert argv[:3] == ["/opt/tf/bin/python", "-I", "-S"] and argv[3].endswith("services/controller/guard.py")
    assert argv[4:] == ["7", "/bin/sh", "-c", "python train.py --lr 0.1"]
    held = guarded_argv("python train.py --lr 0.1", 7, python="/opt/tf/bin/python", hold=9)
    assert held[4:] == ["7", "--hold", "9", "/bin/sh", "-c", "python train.py --lr 0.1"]


def held_guard_up(learner: LearnerProcess) -> bool:
    """The held guard is past its interpreter's start and blocked reading its hold pipe (the group is it alone)."""
    try:
        proc = psutil.Process(learner.pid)
        return proc.status() == psutil.STATUS_SLEEPING and len(group(learner.pid)) == 1
    except psutil.Error:
        return False


def test_a_held_learner_starts_its_command_only_when_released(tmp_path):
    learner, archive = started(tmp_path, "touch ran; echo user-code; exit 3", held=True)
    wait_for(lambda: held_guard_up(learner), 10, "the held guard")
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # held: the guard alone, nothing of the command's
        assert learner.poll() is None and not (tmp_path / "ran").exists() and len(group(learner.pid)) == 1
        time.sleep(0.05)
    assert learner.release()
    assert learner.wait(10) == 3  # the command's own exit, as without a hold
    assert learner.finish_output(10)
    archive.close()
    assert (tmp_path / "ran").exists() and lines(tmp_path) == ["user-code"]


def test_a_held_learner_given_up_exits_without_running_its_command(tmp_path):
    learner, archive = started(tmp_path, "touch ran; sleep 30", held=True)
    wait_for(lambda: held_guard_up(learner), 10, "the held guard")
    learner.give_up_hold()
    assert learner.wait(10) == guard.EXIT_NOT_STARTED
    assert learner.finish_output(10)
    archive.close()
    assert not (tmp_path / "ran").exists() and not group(learner.pid)


def test_a_held_learner_dies_with_its_controller_without_running_its_command(tmp_path):
    learner, archive = started(tmp_path, "touch ran; sleep 30", held=True)
    wait_for(lambda: held_guard_up(learner), 10, "the held guard")
    os.close(learner._lifeline)  # noqa: SLF001 - the kernel closes both ends the controller held when it dies
    learner._lifeline = None  # noqa: SLF001
    learner.give_up_hold()
    assert learner.wait(10) in (-signal.SIGKILL, guard.EXIT_NOT_STARTED)
    wait_for(lambda: not group(learner.pid), 10, "the held group to end")
    assert learner.finish_output(10)
    archive.close()
    assert not (tmp_path / "ran").exists()


def test_releasing_a_held_learner_that_is_gone_says_so(tmp_path):
    learner, archive = started(tmp_path, "touch ran", held=True)
    wait_for(lambda: held_guard_up(learner), 10, "the held guard")
    assert learner.signal_group(signal.SIGKILL)
    assert learner.wait(10) == -signal.SIGKILL
    assert learner.release() is False
    assert learner.finish_output(10)
    archive.close()
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_before_the_command_starts_is_kept_and_nothing_starts(tmp_path, sig):
    # A stop that reaches the group while the guard is held (or its interpreter still starts) reaches the
    # guard alone. Caught and forgotten, the command started anyway, never saw it and was SIGKILLed after the
    # grace period (exit 137 where a stop means 143).
    learner, archive = started(tmp_path, "touch ran; sleep 30", held=True)
    wait_for(lambda: held_guard_up(learner), 10, "the held guard")
    assert learner.signal_group(sig)
    assert learner.release()
    assert learner.wait(10) == -sig, "the guard dies of the signal, as the command would have"
    assert learner.finish_output(10)
    archive.close()
    assert not (tmp_path / "ran").exists() and not group(learner.pid)


def test_a_stop_signal_after_the_command_started_is_the_commands_alone(tmp_path):
    learner, archive = started(tmp_path, "trap 'echo got TERM; exit 7' TERM; echo ready; "
                                         "while true; do sleep 0.05; done", held=True)
    wait_for(lambda: held_guard_up(learner), 10, "the held guard")
    assert learner.release()
    wait_for(lambda: (tmp_path / "a.jsonl").is_file() and "ready" in lines(tmp_path), 10, "the command to start")
    assert learner.signal_group(signal.SIGTERM)
    assert learner.wait(10) == 7, "the command's own exit: the guard passed nothing on twice, nor died of it"
    assert learner.finish_output(10)
    archive.close()
    assert lines(tmp_path).count("got TERM") == 1


@pytest.mark.parametrize(("command", "returncode"), [
    ("exit 0", 0), ("exit 3", 3), ("kill -TERM $$", -signal.SIGTERM), ("kill -KILL $$", -signal.SIGKILL),
])
def test_the_guard_exits_as_the_command_did(tmp_path, command, returncode):
    learner, archive = started(tmp_path, command)
    assert learner.wait(10) == returncode
    assert learner.finish_output(10)
    archive.close()


def test_a_halt_signal_to_the_group_reaches_the_command_and_the_guard_waits_for_it(tmp_path):
    learner, archive = started(tmp_path, "trap 'echo saving; exit 0' TERM; echo ready; "
                                         "while true; do sleep 0.05; done")
    wait_for(lambda: (tmp_path / "a.jsonl").is_file() and "ready" in lines(tmp_path), 10, "the command to start")
    assert learner.signal_group(signal.SIGTERM)
    assert learner.wait(10) == 0, "the guard outlived the SIGTERM and reported the command's exit"
    assert learner.finish_output(10)
    archive.close()
    assert lines(tmp_path)[0] == "ready" and "saving" in lines(tmp_path)  # dash may report "Terminated" too


def test_the_group_dies_when_the_controller_end_of_the_lifeline_closes(tmp_path):
    # the shell forks the program and the program starts a child: neither is the guard's direct child
    child = f"{sys.executable} -c \"import subprocess, sys, time; subprocess.Popen(['sleep', '60']); " \
            f"print('up', flush=True); time.sleep(60)\""
    learner, archive = started(tmp_path, f"{child}; echo never")
    wait_for(lambda: (tmp_path / "a.jsonl").is_file() and "up" in lines(tmp_path), 10, "the grandchildren")
    members = group(learner.pid)
    assert len(members) >= 4, [p.cmdline() for p in members]  # guard, sh, python, sleep
    os.close(learner._lifeline)  # noqa: SLF001 - what the kernel does when the controller dies
    learner._lifeline = None  # noqa: SLF001
    assert learner.wait(10) == -signal.SIGKILL
    wait_for(lambda: not group(learner.pid), 10, "every process of the group to die")
    assert learner.finish_output(10)
    archive.close()
    assert "never" not in lines(tmp_path)


def test_a_guard_whose_controller_is_already_gone_starts_nothing_that_lasts(tmp_path):
    read_end, write_end = os.pipe()
    os.close(write_end)
    started_at = time.monotonic()
    done = psutil.Popen(guarded_argv("sleep 30", read_end), pass_fds=(read_end,), start_new_session=True)
    os.close(read_end)
    assert done.wait(10) == -signal.SIGKILL
    assert time.monotonic() - started_at < 10
    wait_for(lambda: not group(done.pid), 10, "the command to die with the guard")


def test_wait_wakes_on_the_exit_itself_and_times_out_while_the_learner_runs(tmp_path):
    # Popen.wait(timeout) polls with sleeps growing to 50 ms; the learner's pidfd wakes wait() at the exit.
    learner, archive = started(tmp_path, "read line; exit 5")  # stdin is /dev/null: read fails at once
    assert learner._pidfd is not None  # noqa: SLF001 - this kernel (5.3+) has pidfds
    assert learner.wait(30) == 5
    assert learner._pidfd is None, "closed once the exit was seen"  # noqa: SLF001
    assert learner.wait(0) == 5 and learner.poll() == 5, "asked again, the same code"
    assert learner.finish_output(10)
    archive.close()

    running, archive = started(tmp_path, "sleep 30")
    t0 = time.monotonic()
    assert running.wait(0.05) is None
    assert time.monotonic() - t0 < 10
    assert running.signal_group(signal.SIGKILL)
    assert running.wait(30) == -signal.SIGKILL
    assert running.finish_output(10)
    archive.close()


def test_an_entry_replaces_the_guard_and_gets_the_lifeline(tmp_path):
    # the sandbox's entry (enter.py) leads the group and watches the lifeline itself: no guard is started
    seen: list[int] = []

    def entry(fd: int, hold: int | None, *, pass_hold: bool) -> list[str]:
        assert hold is None and not pass_hold  # not held
        seen.append(fd)
        return ["/bin/sh", "-c", f"test -e /proc/self/fd/{fd} && echo has-lifeline; exec sleep 30"]

    archive = LogArchive(tmp_path / "a.jsonl", job="j", team="t", learner=0, attempt=1)
    learner = LearnerProcess("ignored", tmp_path, {"PATH": "/usr/bin:/bin"}, archive, entry=entry)
    learner.start()
    assert len(seen) == 1
    wait_for(lambda: (tmp_path / "a.jsonl").is_file() and "has-lifeline" in lines(tmp_path), 10,
             "the entry to run with the lifeline's read end")
    wait_for(lambda: psutil.Process(learner.pid).cmdline() == ["sleep", "30"], 10, "the entry's command")
    assert not any(str(GUARD) in p.cmdline() for p in group(learner.pid)), "no guard in the learner's group"
    assert learner.signal_group(signal.SIGKILL)
    assert learner.wait(30) == -signal.SIGKILL
    assert learner.finish_output(10)
    archive.close()

"""The learner process: its environment, its output pipes and its memory limit.

The learner runs in its own process group so that a signal reaches every
process it started (torchrun workers, data loaders, shells) and nothing it
leaves behind outlives it. Its environment is built from scratch rather than
inherited: the controller's own TF_* settings hold store credentials a
user's code must not see.

Output is read by one thread per pipe in raw chunks into a spool file
(services/controller/spool.py), which a second thread splits into lines for
the `LogArchive`; the archive only appends to a local file. Neither a slow
log store nor the per-line work can fill the pipe and stall training.
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

from trainforge_frameworks.torch.launch import ddp_env, elastic_command, elastic_env, elastic_restarts
from trainforge_services.common import niceness
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.loop import Loop

from .linebuf import with_hook
from .logship import LogArchive
from .spool import SpooledStream

log = logging.getLogger(__name__)

# A line longer than this is split; keeps one reader's memory bounded.
MAX_LINE_BYTES = 64 * 1024

# Inherited from the controller; everything else is set explicitly. TF_STACK_ID
# is how `trainforge down` finds every process of an embedded stack, learners too.
_INHERITED = ("HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM", "TF_STACK_ID")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def learner_env(spec: LearnerSpec, base: dict[str, str] | None = None,
                python: str = sys.executable) -> dict[str, str]:
    """The learner's environment (docs/CONTRACTS.md, "Learner environment").

    The manifest's `env` may override the inherited and default variables
    but not the platform's own: the DDP rendezvous, TF_*, PATH and
    CUDA_VISIBLE_DEVICES.
    """
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items() if k in _INHERITED or k.startswith("LC_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = str(max(1, math.floor(spec.manifest.resources.cpus)))
    env.update({k: v for k, v in spec.manifest.plain_env().items() if not k.startswith("TF_")})
    # the values of the team secrets the manifest names ({secret: name}), from the 0600 spec file only
    env.update({k: v for k, v in spec.secret_env.items() if not k.startswith("TF_")})
    with_hook(env, spec.manifest.plain_env())  # one write(2) per printed line (services/controller/linebuf.py)
    if spec.manifest.elastic:
        # a torchrun agent node: torchrun gives each worker its RANK and WORLD_SIZE in the current group
        env.update(elastic_env(min_nodes=spec.manifest.min_learners, max_nodes=spec.manifest.max_learners,
                               endpoint_host=spec.master_addr, endpoint_port=spec.master_port,
                               run_id=f"{spec.job_id}-{spec.attempt}", max_restarts=elastic_restarts(spec.manifest.max_learners,
                                                                            spec.manifest.restart.max_restarts),
                               host_store=spec.rank == 0, local_addr=loopback_addr(spec, os.getpid())))
    else:
        # One learner per process group and per device set: its local rank is 0 of 1
        # (frameworks/torch/launch.py explains why).
        env.update(ddp_env(spec.rank, spec.world_size, spec.master_addr, spec.master_port))
    env.update({
        "TF_JOB_ID": spec.job_id,
        "TF_RANK": str(spec.rank),
        "TF_ATTEMPT": str(spec.attempt),
        "TF_WORKDIR": str(spec.workdir),
        "TF_CHECKPOINT_DIR": str(spec.checkpoint_dir),
        "TF_OUTPUT_DIR": str(spec.output_dir),
        "TF_CHECKPOINT_INTERVAL": f"{spec.manifest.checkpoint.interval:g}",
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in spec.gpu_ids),
        "PATH": os.pathsep.join([os.path.dirname(python), base.get("PATH") or _DEFAULT_PATH]),
    })
    return env


def loopback_addr(spec: LearnerSpec, pid: int) -> str | None:
    """This learner's own loopback address when the job's learners share one loopback (the local backend,
    or the job's network namespace in the sandbox), else None (torchrun uses the host's name: a pod's or a
    container's own).

    torchrun names a node by its address and pid. Sandboxed learners all run as pid 2 of their own
    namespace, and a lost learner's slot is started again while its peers may still list the lost node: so
    the address carries the slot (last byte) and this controller's pid (the middle two), all of 127.0.0.0/8
    being loopback.
    """
    if spec.master_addr == "localhost" or spec.master_addr.startswith("127."):
        return f"127.{(pid >> 8) & 255}.{pid & 255}.{spec.rank + 1}"
    return None


def learner_command(spec: LearnerSpec) -> str:
    """The shell command the learner runs: the manifest's, or for an elastic job a torchrun agent running it."""
    command = spec.manifest.rendered_command()
    return elastic_command(command) if spec.manifest.elastic else command


def exit_code_of(returncode: int) -> int:
    """Popen's returncode as a shell reports it: killed by signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"learner was killed by {name} (exit code {exit_code_of(returncode)})"
    return f"learner exited with code {returncode}"


def launcher_reason(spec: LearnerSpec) -> str:
    """What the spec's launcher wrote about how the command ended ('' when nothing)."""
    if not spec.launcher:
        return ""
    try:
        return spec.exit_reason_path.read_text().strip()
    except OSError:
        return ""


def human_bytes(n: float) -> str:
    """1536 -> '1.5Ki'; binary units as in the manifest's memory field."""
    if n < 1024:
        return f"{n:.0f}B"
    for unit in ("Ki", "Mi", "Gi"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f}{unit}"
    return f"{n / 1024:.1f}Ti"


# The learner's process-group leader; see its docstring for why the learner needs one.
GUARD = Path(__file__).with_name("guard.py")


def guarded_argv(command: str, lifeline: int, python: str = sys.executable,
                 program: list[str] | None = None, hold: int | None = None, *, pass_hold: bool = False) -> list[str]:
    """argv of a learner: `/bin/sh -c command` (or `program`, the shell wrapped in a sandbox) under the
    guard (the platform's interpreter, isolated), which watches the pipe end `lifeline`; with `hold`, the
    guard waits for a byte on that pipe end before it starts the command, or with `pass_hold` starts it at
    once and hands the pipe on to it (a Python interpreter that holds itself, pyhold.py)."""
    held = ["--pass-hold" if pass_hold else "--hold", str(hold)] if hold is not None else []
    return [python, "-I", "-S", str(GUARD), str(lifeline), *held, *(program or ["/bin/sh", "-c", command])]


class LearnerProcess:
    """`/bin/sh -c command` in the working directory, its output going to a LogArchive.

    The command runs under the guard (services/controller/guard.py), which
    leads its process group and takes the group down when this process dies:
    `pid` is the guard's, the group's id, and the guard exits the way the
    command did. With `program` (a backend's launcher), the guard runs that
    instead of the bare shell. With `entry` (the sandbox's,
    services/controller/sandbox/enter.py), no guard runs: `entry(fd)` is the
    argv of a program that leads the group and watches the lifeline `fd`
    itself, with the same promise.

    With `held` (a prestarted trial, docs/EXPERIMENTS.md "Prestarted
    trials"), `start()` starts the guard or entry - its interpreter, the
    sandbox, the output pipes - but that process then waits on a hold pipe
    before it starts the command: `release()` starts the command,
    `give_up_hold()` makes the process exit without starting it. With
    `held` and `self_held` (pyhold.holds_itself said so of the command), the
    command itself starts too, a Python interpreter that waits on the hold
    pipe in the learners' start-up hook before the user's program; release
    and give-up work the same.
    """

    def __init__(self, command: str, cwd: Path, env: dict[str, str], archive: LogArchive, *,
                 python: str = sys.executable, program: list[str] | None = None,
                 entry: Callable[..., list[str]] | None = None, cpus: frozenset[int] | None = None,
                 held: bool = False, self_held: bool = False, nice: int = 0):
        self.command, self.cwd, self.env, self.archive = command, Path(cwd), env, archive
        self.nice = nice  # the learner's session runs at this nice at least (common/niceness.py)
        self.held, self.self_held = held, held and self_held
        self.python, self.program, self.entry = python, program, entry
        self.cpus = cpus  # the learner's CPUs (priority.plan_placement); None: the controller's own
        self.proc: subprocess.Popen | None = None
        self._readers: list[SpooledStream] = []
        self._lifeline: int | None = None  # the write end the guard watches; closed only when we are done
        self._pidfd: int | None = None  # readable once the guard exited (wait() wakes at once, no polling)
        self._hold: int | None = None  # a held learner's hold pipe (write end): a byte starts the command

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the learner has not been started")
        return self.proc.pid

    def start(self) -> None:
        read_end, write_end = os.pipe()  # both close-on-exec: only the guard (or entry) gets the read end
        hold_r, hold_w = os.pipe() if self.held else (None, None)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        own = self._pin_self(self.cpus)  # the child inherits the forking thread's affinity
        try:
            argv = (self.entry(read_end, hold_r, pass_hold=self.self_held) if self.entry is not None
                    else guarded_argv(self.command, read_end, self.python, self.program, hold_r,
                                      pass_hold=self.self_held))
            self.proc = subprocess.Popen(
                argv, cwd=self.cwd, env=self.env,
                stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, start_new_session=True,
                close_fds=True, pass_fds=(read_end,) if hold_r is None else (read_end, hold_r))
        except BaseException:
            for fd in (write_end, hold_w, out_r, err_r):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            self._pin_self(own)
            for fd in (read_end, hold_r, out_w, err_w):
                if fd is not None:
                    os.close(fd)
        self._lifeline, self._hold = write_end, hold_w
        # its own session is a new autogroup at nice 0, whatever nice it inherited from this thread
        for problem in niceness.lower(self.nice, self.proc.pid):
            log.warning("learner %d runs at the control plane's priority: %s", self.proc.pid, problem)
        self._pidfd = _pidfd_of(self.proc.pid)
        for stream, fd in (("stdout", out_r), ("stderr", err_r)):
            spool = self.archive.path.with_name(f"{self.archive.path.name}.{stream}.spool")
            self._readers.append(SpooledStream(stream, fd, self.archive, spool, MAX_LINE_BYTES).start())

    def release(self) -> bool:
        """A held learner: start its command now. False when the held process is gone (nothing to start)."""
        if self._hold is None:
            raise RuntimeError("the learner is not held")
        try:
            os.write(self._hold, b"\n")
            return True
        except BrokenPipeError:
            return False
        finally:
            os.close(self._hold)
            self._hold = None

    def give_up_hold(self) -> None:
        """A held learner that will not run: close the hold pipe, so the held process exits without starting
        the command (guard.EXIT_NOT_STARTED). Then wait() sees it exit; finish_output() reaps the rest."""
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None

    @staticmethod
    def _pin_self(cpus: frozenset[int] | set[int] | None) -> set[int] | None:
        """Pin the calling thread to cpus (None: leave it); its affinity before, to restore."""
        if not cpus:
            return None
        try:
            before = os.sched_getaffinity(0)
            os.sched_setaffinity(0, cpus)
            return before
        except OSError as e:
            log.warning("cannot place the learner on CPUs %s: %s", sorted(cpus), e)
            return None

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def wait(self, timeout: float | None = None) -> int | None:
        """The returncode once the learner exited, None when `timeout` passed first.

        Popen.wait with a timeout polls with sleeps growing to 50 ms, so an exit was seen up to
        50 ms late; a pidfd becomes readable the moment the guard exits.
        """
        if self.proc is None:
            return None
        if self._pidfd is not None and self.proc.returncode is None:
            try:
                ready, _, _ = select.select([self._pidfd], [], [], timeout)
            except InterruptedError:
                ready = []
            if not ready:
                return self.proc.poll()
            returncode = self.proc.wait()  # exited: this reaps it at once
            self._close_pidfd()
            return returncode
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def signal_group(self, sig: int) -> bool:
        """Send sig to the learner's process group; False when none of it is left."""
        try:
            os.killpg(self.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def group_alive(self) -> bool:
        """Whether any process of the learner's group (the command and what it started) is left."""
        try:
            os.killpg(self.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def finish_output(self, timeout: float) -> bool:
        """After the learner exited: stop what it left running and read its last lines."""
        self.signal_group(signal.SIGKILL)
        self._close_pidfd()
        self.give_up_hold()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        # each stream's pipe gets `timeout` to end, and its lines as long as they keep being numbered (SpooledStream.join)
        done = [r.join(timeout) for r in self._readers]
        return all(done)

    def tree_rss(self) -> int:
        """Resident memory of everything the command started, in bytes (the guard is the platform's)."""
        try:
            procs = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total


def _pidfd_of(pid: int) -> int | None:
    """A pidfd of our child `pid` (Linux 5.3+), None where the kernel or Python has none (then wait() polls)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class MemoryWatchdog:
    """Kills the learner's process group when its tree's RSS exceeds the limit."""

    def __init__(self, learner: LearnerProcess, limit: int, interval: float = 1.0,
                 on_exceeded: Callable[[str], None] | None = None):
        self.learner, self.limit, self.interval = learner, limit, interval
        self._on_exceeded = on_exceeded
        self._loop = Loop("memory-watchdog", self._look, interval=interval)
        self.message = ""
        self.peak = 0

    def start(self) -> MemoryWatchdog:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop(self.interval + 5)

    def _look(self) -> None:
        if self.learner.poll() is not None:
            self._loop.stop()  # the learner is gone: nothing left to measure
            return
        rss = self.learner.tree_rss()
        self.peak = max(self.peak, rss)
        if rss > self.limit:
            self.message = f"memory limit exceeded: {human_bytes(rss)} > {human_bytes(self.limit)}"
            log.warning("%s; killing the learner", self.message)
            self.learner.signal_group(signal.SIGKILL)
            self._loop.stop()
            if self._on_exceeded is not None:
                self._on_exceeded(self.message)

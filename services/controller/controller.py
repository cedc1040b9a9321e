"""One learner's life, from an empty working directory to a final status.

PREPARING (code, data, checkpoint) -> RUNNING -> STORING (outputs, log
archive) -> COMPLETED, or FAILED with the exit code, a message and the last
lines. Whatever goes wrong - a download, the learner, an upload, the
controller itself - ends in a FAILED status that says why, never in a bare
traceback, because the job monitor can only report what it reads in etcd.

Halting (docs/CONTRACTS.md, "Halt, resume, restart"; services/controller/halt.py):
a thread watches the job's `halt` key; a halt for this attempt publishes
LEARNER_HALTING and stops the learner like any stop request (SIGTERM, SIGKILL
after the grace: services/controller/stopping.py). However it then exits, its
newest checkpoint is uploaded and verified, the `halted` key is written and
the final status is LEARNER_HALTED with the step, so a resume continues from
there. A halt that comes while preparing stops before the learner starts and
still ends HALTED, naming the checkpoint a resume would restore; one that
comes after the learner exited changes nothing. While the learner runs, its
checkpoints are copied to the object store as they appear
(services/controller/checkpoints.py), so a learner that is lost still leaves
its last periodic checkpoint behind. How a run ended is an `Outcome`
(services/controller/outcome.py).

The learner runs under a guard process (services/controller/guard.py) that
kills the learner's whole process group when the controller dies, even by
SIGKILL, so no learner runs on unwatched; in the sandbox its entry
(services/controller/sandbox/enter.py) keeps that promise itself.

Before the final status is written the log shipper is drained, so a user
who reads "exit code 3" in the job's reason finds the same last lines in
the log search. The final status is written without the lease so it
outlives the controller.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path

from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.adapters.objectstore import ObjectStore, put_dir
from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.contracts.storekeys import uri_for_prefix
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.settings import ControllerSettings
from trainforge_services.common.states import LearnerState

from .checkpoints import CheckpointSync, copy_uri
from .gate import HELD, GateWatchFailed, wait_for_gate
from .gatewaystore import JobStores
from .halt import Halting
from .lagreport import LagReporter
from .learner import (
    LearnerProcess,
    MemoryWatchdog,
    describe_exit,
    exit_code_of,
    launcher_reason,
    learner_command,
    learner_env,
)
from .logship import LogArchive, LogShipper, LogSink, upload_earlier_archives
from .metricstail import MetricsChannel
from .outcome import FINAL_STATUS_SECONDS, Outcome, system_line, text
from .priority import Placement, plan_placement, set_output_cpus
from .pyenv import BuildStopped, EnvCache, requirements_of
from .pyhold import holds_itself
from .sandbox import Sandbox, choose, container_egress
from .status import StatusPublisher
from .stopping import StopRequest, wait_for_learner
from .workdir import Stopped, prepare

log = logging.getLogger(__name__)

# How often a running learner's checkpoint directory and the job's halt key are looked at.
CHECKPOINT_POLL = 1.0
HALT_POLL = 0.5
# The archive's writes are flushed at least this often while the learner prints (see LogArchive).
ARCHIVE_FLUSH_SECONDS = 0.005
READERS_SECONDS = 10.0
# How long a held learner whose hold was given up may take to exit before its group is killed.
HOLD_EXIT_SECONDS = 5.0
# How often an environment build's progress is published as the PREPARING status, and how much of a line.
ENV_PROGRESS_SECONDS = 1.0
MAX_PROGRESS_CHARS = 300


class Controller:
    """Runs one learner as described by its spec; `run()` returns the controller's exit code."""

    def __init__(self, spec: LearnerSpec, settings: ControllerSettings, *, coordinator: Coordinator | None = None,
                 store: ObjectStore | None = None, sink: LogSink | None = None, python: str = sys.executable,
                 checkpoint_poll: float = CHECKPOINT_POLL, halt_poll: float = HALT_POLL):
        self.spec, self.settings, self.python = spec, settings, python
        self._owned: list = []  # clients this controller made, closed when it is done
        if coordinator is None:
            coordinator = Coordinator.of(settings)
            self._owned.append(coordinator)
        self._coord = coordinator
        self._stores = JobStores(settings, spec.job_id)  # the job gateway's, or the platform's own
        self._owned.append(self._stores)
        self._store, self._sink = store, sink
        self._stop = StopRequest()
        self._done = threading.Event()
        self._learner: LearnerProcess | None = None
        self._placement: Placement | None = None
        self._checkpoints = CheckpointSync(self._object_store, self._coord, job_id=spec.job_id, rank=spec.rank,
                                           attempt=spec.attempt, directory=spec.checkpoint_dir,
                                           scratch=spec.workdir.parent, interval=checkpoint_poll,
                                           world_size=spec.world_size)
        self.status = StatusPublisher(self._coord, self._coord.keys.learner_status(spec.job_id, spec.rank),
                                      spec.lease_ttl)
        self._halt = Halting(spec, self._coord, self._checkpoints, self._object_store, publish=self._publish,
                             request_stop=self.request_stop, poll=halt_poll)
        self._isolation = ""  # what the learner got, once decided (services/controller/sandbox/)

    def _object_store(self) -> ObjectStore:
        return self._store if self._store is not None else self._stores.objects()

    def request_stop(self, reason: str) -> None:
        """Stop the learner (SIGTERM, then SIGKILL after kill_grace); safe from a signal handler."""
        self._stop.request(reason)

    def _publish(self, state: LearnerState, **kw) -> None:
        log.info("learner %s/%d attempt %d: %s", self.spec.job_id, self.spec.rank, self.spec.attempt, state.name)
        self.status.publish(LearnerStatus(state=state, attempt=self.spec.attempt, isolation=self._isolation, **kw))

    # -- the run ------------------------------------------------------------------

    def run(self) -> int:
        spec = self.spec
        self.status.start()
        self._publish(LearnerState.LEARNER_PREPARING)
        # The first look at the halt key is made here, so a controller started for an attempt that is
        # already being halted (an LCM redoing a deploy, say) never starts its learner.
        if self._halt.check():
            self._halt.watch(self._done)
        sink = self._sink or self._stores.log_sink("log")
        # the learner's CPUs and the output threads' (priority.py); set before the shipper starts
        place = self.settings.place_cpus
        self._placement = plan_placement(spec.manifest.resources.cpus) if place != "off" else None
        set_output_cpus(self._placement.output if self._placement else None)
        shipper = LogShipper(spec.archive_path, sink, max_lines=self.settings.log_batch_lines,
                             max_seconds=self.settings.log_batch_seconds)
        try:
            archive = LogArchive(spec.archive_path, job=spec.job_id, team=spec.team, learner=spec.rank,
                                 attempt=spec.attempt, on_append=shipper.notify,
                                 flush_interval=ARCHIVE_FLUSH_SECONDS)
            shipper.before_read = archive.flush
        except OSError as e:
            return self._finish(Outcome(LearnerState.LEARNER_FAILED,
                                        message=f"cannot create the log archive: {text(e)}"), 0)
        shipper.start()
        lag = LagReporter(self._coord, self._coord.keys.logship(spec.job_id, spec.rank), spec.attempt,
                          lambda: self.status.lease, lambda: (archive.lines_written, shipper.shipped)).start()
        upload_earlier_archives(spec, self._object_store)
        metrics = MetricsChannel(spec, self._stores.log_sink("metrics"), flush_interval=ARCHIVE_FLUSH_SECONDS).start()
        rc = 0
        try:
            outcome = self._run_learner(archive)
        except Exception as e:  # noqa: BLE001 - a controller bug still ends in a FAILED status
            log.exception("controller error")
            if self._learner is not None and self._learner.poll() is None:
                self._learner.signal_group(signal.SIGKILL)  # no learner runs on unwatched
            outcome = Outcome(LearnerState.LEARNER_FAILED, message=f"controller error: {type(e).__name__}: {e}")
            rc = 1
        metrics.finish(min(self.settings.log_drain_seconds, 5.0), self._object_store)
        outcome.tail = archive.tail()
        if outcome.state == LearnerState.LEARNER_FAILED:
            system_line(archive, outcome.message)
        archive.close()

        if not shipper.close(self.settings.log_drain_seconds):
            log.warning("%d of %d log lines reached the log store (last error: %s); the archive keeps them all",
                        shipper.shipped, archive.lines_written, shipper.last_error or "timed out")
        lag.stop()  # its key goes with the status lease, revoked once the final status is written
        outcome.lines_archived, outcome.lines_shipped = archive.lines_written, shipper.shipped
        try:
            self._upload_log_archive()
        except Exception as e:  # noqa: BLE001 - the final status must be written whatever happened
            log.error("uploading the log archive failed: %s", text(e))
            if outcome.state == LearnerState.LEARNER_COMPLETED:
                outcome = Outcome(LearnerState.LEARNER_FAILED, exit_code=outcome.exit_code, tail=outcome.tail,
                                  message=f"uploading the log archive failed: {text(e)}",
                                  lines_archived=outcome.lines_archived, lines_shipped=outcome.lines_shipped)

        return self._finish(outcome, rc)

    def _finish(self, outcome: Outcome, rc: int) -> int:
        spec = self.spec
        self._done.set()
        final = outcome.status(spec.attempt, self._isolation)
        log.info("learner %s/%d attempt %d: %s%s", spec.job_id, spec.rank, spec.attempt, outcome.state.name,
                 f" ({outcome.message})" if outcome.message else "")
        if not self.status.finish(final, FINAL_STATUS_SECONDS):
            log.error("the final status could not be written to etcd; the monitor will see the lease expire")
            rc = rc or 1
        for client in self._owned:
            try:
                client.close()
            except Exception as e:  # noqa: BLE001 - closing is best effort on the way out
                log.debug("closing %s failed: %s", type(client).__name__, e)
        return rc

    def _run_learner(self, archive: LogArchive) -> Outcome:
        spec = self.spec
        try:
            restored = prepare(spec, self._object_store(), self._stop.is_set)
        except Stopped as e:
            if self._halt.is_set():
                return self._halt.conclude(archive, None, "before the learner started")
            return Outcome(LearnerState.LEARNER_FAILED, message=f"{self._stop.reason}: {e} (learner not started)")
        except (TrainforgeError, OSError) as e:
            return Outcome(LearnerState.LEARNER_FAILED, message=f"preparing the learner failed: {text(e)}")
        if restored is not None:
            self._checkpoints.mark_restored(restored, copy_uri(spec.checkpoint_uri, spec.rank, restored))
            system_line(archive, f"restored the checkpoint at step {restored}")
        elif spec.checkpoint_uri:
            system_line(archive, f"no complete checkpoint found; starting from scratch (no step under "
                                 f"{spec.checkpoint_uri} was stored by all {spec.world_size} learners)")
        try:
            learner_python = self._environment(archive)
        except BuildStopped as e:
            if self._halt.is_set():
                return self._halt.conclude(archive, None, "before the learner started")
            return Outcome(LearnerState.LEARNER_FAILED, message=f"{self._stop.reason}: {e} (learner not started)")
        except (TrainforgeError, OSError) as e:
            return Outcome(LearnerState.LEARNER_FAILED, message=f"preparing the learner failed: {text(e)}")
        if self._stop.is_set():
            if self._halt.is_set():
                return self._halt.conclude(archive, None, "before the learner started")
            return Outcome(LearnerState.LEARNER_FAILED, message=f"{self._stop.reason} (learner not started)")

        if spec.launcher:
            # the backend's launcher runs the command in its own isolation (the docker backend: a container)
            self._isolation = "container"
            return self._run_prepared(archive, None, learner_python)
        chosen = choose(spec, self.settings, python=learner_python)
        self._isolation = chosen.isolation.value
        if chosen.note:
            system_line(archive, chosen.note)
        if chosen.refused:
            return Outcome(LearnerState.LEARNER_FAILED, message=chosen.refused)
        try:
            return self._run_prepared(archive, chosen.sandbox, learner_python)
        finally:
            if chosen.sandbox is not None:
                chosen.sandbox.cleanup()

    def _run_prepared(self, archive: LogArchive, sandbox: Sandbox | None, learner_python: str) -> Outcome:
        spec = self.spec
        env = learner_env(spec, python=learner_python)
        if learner_python != self.python:
            env["VIRTUAL_ENV"] = str(Path(learner_python).parent.parent)
        program = entry = None
        command = learner_command(spec)
        if sandbox is not None:
            # the sandbox's entry leads the learner's group and watches the lifeline itself: no guard to start
            env, entry = sandbox.env(env), partial(sandbox.argv, command)
        elif spec.launcher:  # which relays into its container what the egress policy allows (TF_EGRESS)
            program = [*spec.launcher, "/bin/sh", "-c", command]
            env.update(container_egress(spec, self.settings))
        # a held Python command waits in its own interpreter, already started (pyhold.py); behind a launcher
        # the command runs elsewhere (a container), so the guard holds it
        self_held = spec.gated and not spec.launcher and holds_itself(command, env)
        learner = self._learner = LearnerProcess(command, spec.workdir, env, archive,
                                                 python=self.python, program=program, entry=entry,
                                                 cpus=self._placement.learner
                                                 if self._placement and self.settings.place_cpus == "all" else None,
                                                 held=spec.gated, self_held=self_held,
                                                 nice=self.settings.job_nice)
        try:
            learner.start()
        except OSError as e:
            return Outcome(LearnerState.LEARNER_FAILED, message=f"starting the learner failed: {text(e)}")
        if spec.gated:
            log.info("learner held (pid %d, %s): %s", learner.pid,
                     "in its interpreter" if self_held else "before its command", learner.command)
            not_started = self._pass_gate(archive, learner)
            if not_started is not None:
                return not_started
        log.info("learner started (pid %d): %s", learner.pid, learner.command)
        self._halt.publish_unless_halting(LearnerState.LEARNER_RUNNING)  # a halt published meanwhile stands
        # In a root sandbox the memory cgroup enforces the limit, behind a launcher the container's; the watchdog
        # is the fallback without either (userns mode has no cgroups; behind a launcher it would measure only
        # the launcher's own memory).
        watched = (sandbox is None or not sandbox.limits_memory) and not spec.launcher
        watchdog = MemoryWatchdog(learner, spec.manifest.resources.memory)
        if watched:
            watchdog.start()
        self._checkpoints.start()
        returncode, killed = wait_for_learner(learner, archive, self._stop, grace=self.settings.kill_grace,
                                              timeout=spec.manifest.timeout)
        halted = self._halt.learner_exited()  # from here a halt no longer changes the outcome
        if watched:
            watchdog.stop()
        self._checkpoints.stop()
        if not learner.finish_output(READERS_SECONDS):
            log.warning("the learner's output pipes did not close; its last lines may be missing")
        exit_code = exit_code_of(returncode)
        log.info("%s", describe_exit(returncode))
        reason = launcher_reason(spec)

        if halted:
            how = ("killed after the grace period" if killed
                   else describe_exit(returncode) if returncode >= 0 else "stopped after SIGTERM")
            return self._halt.conclude(archive, exit_code, how)
        self._final_checkpoint()
        oom = watchdog.message or (sandbox.oom_message() if sandbox is not None and returncode != 0 else "")
        if oom:
            return Outcome(LearnerState.LEARNER_FAILED, exit_code, oom)
        if self._stop.is_set():
            return Outcome(LearnerState.LEARNER_FAILED, exit_code, f"{self._stop.reason}; {describe_exit(returncode)}",
                           timed_out=self._stop.timed_out)
        if returncode != 0:
            return Outcome(LearnerState.LEARNER_FAILED, exit_code, reason or describe_exit(returncode))

        self._publish(LearnerState.LEARNER_STORING, exit_code=0)
        if not spec.output_dir.resolve().is_relative_to(spec.workdir.resolve()):
            return Outcome(LearnerState.LEARNER_FAILED, 0, f"the outputs folder {spec.manifest.outputs} resolves "
                                                           f"outside the working directory; not uploading it")
        try:
            uploaded = put_dir(self._object_store(), spec.outputs_prefix, spec.output_dir)
        except (TrainforgeError, OSError) as e:
            return Outcome(LearnerState.LEARNER_FAILED, 0, f"uploading outputs failed: {text(e)}")
        outputs = uri_for_prefix(spec.outputs_prefix)
        log.info("uploaded %d output files to %s", len(uploaded), outputs)
        return Outcome(LearnerState.LEARNER_COMPLETED, 0, outputs_uri=outputs)

    def _pass_gate(self, archive: LogArchive, learner: LearnerProcess) -> Outcome | None:
        """A gated learner (a prestarted trial): its process is started and held just before the command (the
        guard's or the sandbox entry's hold); wait for the job's gate (gate.py), then release it. None once
        the command started; else how the attempt ends, with nothing of the user's run and nothing left."""
        self._halt.publish_unless_halting(LearnerState.LEARNER_PREPARING, message=HELD)
        failure = ""
        try:
            opened = wait_for_gate(self._coord, self.spec.job_id,
                                   lambda: self._stop.is_set() or learner.poll() is not None)
        except GateWatchFailed as e:
            opened, failure = False, str(e)
        if opened:
            system_line(archive, "the gate opened: starting the learner")
            if learner.release():
                return None
        learner.give_up_hold()  # the held process exits without starting the command
        returncode = learner.wait(HOLD_EXIT_SECONDS)
        if not learner.finish_output(READERS_SECONDS):  # SIGKILLs the group if it is still there
            log.warning("the held learner's output pipes did not close")
        if self._halt.is_set():
            return self._halt.conclude(archive, None, "before the learner started")
        if self._stop.is_set():
            return Outcome(LearnerState.LEARNER_FAILED, message=f"{self._stop.reason} (learner not started)")
        if failure:
            return Outcome(LearnerState.LEARNER_FAILED, message=f"{failure} (learner not started)")
        how = describe_exit(returncode) if returncode is not None else "it did not exit"
        return Outcome(LearnerState.LEARNER_FAILED,
                       message=f"the held learner process ended before its command started ({how})")

    def _environment(self, archive: LogArchive) -> str:
        """The learner's interpreter: the platform's, or the job's own environment (services/controller/pyenv.py)."""
        reqs = requirements_of(self.spec.manifest, self.spec.workdir)
        if reqs is None:
            return self.python
        shown = [0.0]

        def progress(line: str) -> None:
            system_line(archive, line)
            now = time.monotonic()
            if now - shown[0] >= ENV_PROGRESS_SECONDS:  # etcd sees a line a second, the archive every line
                shown[0] = now
                self._halt.publish_unless_halting(LearnerState.LEARNER_PREPARING, message=line[:MAX_PROGRESS_CHARS])

        cache = EnvCache(self.settings.env_cache(), python=self.python, timeout=self.settings.env_build_timeout,
                         source_builds=self.settings.env_source_builds)
        python = cache.ensure(reqs, progress=progress, stop_requested=self._stop.is_set)
        # the status says PREPARING without a stale installer line, unless a HALTING was published meanwhile
        self._halt.publish_unless_halting(LearnerState.LEARNER_PREPARING, message="environment ready")
        return str(python)

    def _final_checkpoint(self) -> None:
        """A learner that exited for any other reason may have left a newer checkpoint: keep it if possible."""
        try:
            self._checkpoints.sync()
        except (TrainforgeError, OSError) as e:
            log.warning("the learner's last checkpoint could not be stored: %s", text(e))

    def _upload_log_archive(self) -> None:
        if self.spec.archive_path.is_file():
            self._object_store().put_file(self.spec.log_key, self.spec.archive_path)

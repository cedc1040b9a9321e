"""Halting a learner (docs/CONTRACTS.md, "Halt, resume, restart"): the halt key, and what a halt leaves behind.

A loop polls the job's `halt` key; a halt for this attempt publishes
LEARNER_HALTING and asks the controller to stop the learner like any stop
request. However the learner then exits, `conclude` uploads and verifies its
newest checkpoint, writes the `halted` key and returns the LEARNER_HALTED
outcome with the step, so a resume continues from there. A halt and the
learner's exit race: the lock held here decides which came first, and a halt
that comes after the exit changes nothing. The same lock keeps the run from
publishing RUNNING or PREPARING over a HALTING that was published meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.contracts.etcd import Halted, HaltRequest
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.errors import InvalidArgument, TrainforgeError
from trainforge_services.common.loop import Loop
from trainforge_services.common.retry import QUICK
from trainforge_services.common.states import LearnerState

from .checkpoints import CheckpointSync, choose_step, copy_uri
from .logship import LogArchive
from .outcome import FINAL_STATUS_SECONDS, Outcome, system_line, text

log = logging.getLogger(__name__)


class Halting:
    """One attempt's halt: watches the halt key, orders a halt against the learner's exit, concludes it."""

    def __init__(self, spec: LearnerSpec, coordinator: Coordinator, checkpoints: CheckpointSync,
                 object_store: Callable[[], ObjectStore], *, publish: Callable[..., None],
                 request_stop: Callable[[str], None], poll: float):
        self.spec = spec
        self._coord = coordinator
        self._checkpoints = checkpoints
        self._object_store = object_store
        self._publish = publish
        self._request_stop = request_stop
        self._watching = Loop("halt-watch", self._look, interval=poll)
        self._learner_done: threading.Event | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()  # a halt and the learner's exit: whichever comes first decides
        self._learner_exited = False
        self._bad_halt: dict | None = None

    def is_set(self) -> bool:
        """Whether a halt for this attempt was obeyed."""
        return self._halt.is_set()

    def publish_unless_halting(self, state: LearnerState, **kw) -> None:
        """Publish a status of the run, but never over a HALTING published meanwhile."""
        with self._lock:
            if not self._halt.is_set():
                self._publish(state, **kw)

    def learner_exited(self) -> bool:
        """From here a halt no longer changes the outcome; True when one came before."""
        with self._lock:
            self._learner_exited = True
            return self._halt.is_set()

    def watch(self, done: threading.Event) -> None:
        """Poll the job's halt key (cheap, and indifferent to etcd restarts) until `done` says the learner has
        exited; returns at once."""
        self._learner_done = done
        self._watching.start()

    def _look(self) -> None:
        done = self._learner_done
        if (done is not None and done.is_set()) or not self.check():
            self._watching.stop()

    def check(self) -> bool:
        """Look at the halt key once and obey a halt for this attempt; False once there is nothing left to watch."""
        key = self._coord.keys.halt(self.spec.job_id)
        try:
            doc, _ = self._coord.get(key)
        except Exception as e:  # noqa: BLE001 - etcd down: look again later
            log.debug("reading the halt key failed: %s", text(e))
            return True
        if doc is None:
            return True
        try:
            request = HaltRequest.parse(doc)
        except InvalidArgument as e:  # someone else's bad write must not stop the learner or this watch
            if doc != self._bad_halt:  # once per value, not at every look
                log.warning("ignoring the value at %s: %s", key, e.message)
                self._bad_halt = doc
            return True
        if request.attempt != self.spec.attempt:
            return True
        with self._lock:
            if self._learner_exited:
                return False  # too late: the learner is done and its outcome stands
            self._halt.set()
            self._publish(LearnerState.LEARNER_HALTING)
        self._request_stop("halt requested")
        return False

    def conclude(self, archive: LogArchive, exit_code: int | None, how: str) -> Outcome:
        """After the learner stopped for a halt: store its newest checkpoint, say so in etcd."""
        spec = self.spec
        problem = ""
        try:
            self._checkpoints.sync()
        except (TrainforgeError, OSError) as e:
            problem = f"; the newest checkpoint could not be stored ({text(e)}), an older one is used"
        if self._checkpoints.uploaded_step is None and spec.checkpoint_uri:
            self._adopt_stored_checkpoint()
        step, uri = self._checkpoints.uploaded_step, self._checkpoints.uploaded_uri
        self._write_halted(Halted(attempt=spec.attempt, step=step, checkpoint_uri=uri))
        if step is None:
            message = f"halted ({how}) without a checkpoint; a resume starts over{problem}"
        else:
            message = f"halted ({how}); checkpoint at step {step} stored at {uri}{problem}"
        system_line(archive, message)
        return Outcome(LearnerState.LEARNER_HALTED, exit_code, message, step=step, checkpoint_uri=uri)

    def _write_halted(self, value: Halted) -> None:
        """The `halted` key, retried through a short etcd outage (the final status is retried the same way)."""
        key = self._coord.keys.learner_halted(self.spec.job_id, self.spec.rank)
        try:
            QUICK.within(deadline=FINAL_STATUS_SECONDS).call(lambda: self._coord.put(key, value.value()),
                                                             retry_on=TrainforgeError)
        except TrainforgeError as e:
            log.warning("could not write the halted key: %s", e.message)

    def _adopt_stored_checkpoint(self) -> None:
        """Halted before the learner restored anything: what a resume would restore is still the checkpoint."""
        spec = self.spec
        try:
            step = choose_step(self._object_store(), spec.checkpoint_uri, spec.rank, spec.world_size,
                               own=spec.manifest.elastic)
        except (TrainforgeError, OSError) as e:
            log.warning("could not look up the stored checkpoints at %s: %s", spec.checkpoint_uri, text(e))
            return
        if step is not None:
            self._checkpoints.mark_restored(step, copy_uri(spec.checkpoint_uri, spec.rank, step))

"""The lifecycle's supervision pass: dead job monitors started again, lost controllers reported.

A job monitor that died before it delivered its attempt's last state (the
backend reports `monitor_done` from the `monitor.done` marker,
`trainforge_services.common.keys.MONITOR_DONE`) is started again; it resumes from etcd.
This also covers an attempt whose every process died while no LCM watched:
the monitor, not a second run of the same attempt, decides how it ended.

A controller the backend sees gone leaves its learner unreported when it
died before writing any status, or when its leased status expired before a
(restarted) monitor saw it: both would make the monitor wait out its start
timeout. So the lifecycle writes `LearnerStatus(LEARNER_FAILED)` for that
rank, create-if-absent: a final status the controller wrote always wins, and
a leased one is left to expire first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.states import LearnerState
from trainforge_services.lcm.backends.base import AttemptPlan, Backend, JobView, Role
from trainforge_services.lcm.lifecycle.records import AttemptRecord
from trainforge_services.lcm.store import RecordStore

log = logging.getLogger(__name__)

# The least time between two restarts of one job's monitor (one that keeps dying at start, e.g. while
# etcd is down, is not started in a tight loop).
RESPAWN_SPACING = 5.0


def launched(record: AttemptRecord, view: JobView) -> bool:
    """The attempt was fully launched (every process it plans was started) and is not being removed."""
    return not record.killing and view.names() >= record.plan.expected()


def unfinished(record: AttemptRecord, view: JobView) -> bool:
    """A fully launched attempt, not being removed, whose monitor has not delivered its last state."""
    return launched(record, view) and not view.monitor_done


class Supervision:
    def __init__(self, backend: Backend, coordinator: Coordinator, records: RecordStore[AttemptRecord],
                 job_lock: Callable[[str], threading.Lock], attach: Callable[[AttemptPlan], AttemptPlan]):
        self._backend = backend
        self._attach = attach  # the plan with its credentials (lifecycle/credentials.py)
        self._coord = coordinator
        self._records = records
        self._job_lock = job_lock
        self._respawned: dict[str, float] = {}

    def run_once(self) -> None:
        for record in self._records.all():
            lock = self._job_lock(record.job_id)
            if not lock.acquire(blocking=False):
                continue  # a deploy or kill of this job is under way
            try:
                current = self._records.get(record.job_id)
                if current is None:
                    continue
                view = self._backend.observe(current.plan)
                if unfinished(current, view):
                    self.revive_monitor(current, view, spaced=True)
                    self._report_lost_controllers(current, view)
            finally:
                lock.release()

    def revive_monitor(self, record: AttemptRecord, view: JobView, *, spaced: bool) -> bool:
        """Start the monitor of an unfinished attempt again if it is gone (the caller holds the job's lock);
        whether it did."""
        if not unfinished(record, view):
            return False
        if any(o.alive for o in view.processes if o.handle.role is Role.MONITOR):
            return False
        now = time.monotonic()
        if spaced and now - self._respawned.get(record.job_id, -1e9) < RESPAWN_SPACING:
            return False
        self._respawned[record.job_id] = now
        self._coord.confirm()
        log.warning("job %s attempt %d: its monitor died before the attempt ended; starting it again",
                    record.job_id, record.attempt)
        self._backend.restart_monitor(self._attach(record.plan))
        return True

    def _report_lost_controllers(self, record: AttemptRecord, view: JobView) -> None:
        reported = set(record.reported_dead)
        for observed in view.processes:
            handle = observed.handle
            if handle.role is not Role.CONTROLLER or handle.rank is None or observed.alive \
                    or handle.rank in reported:
                continue
            status = LearnerStatus(state=LearnerState.LEARNER_FAILED, attempt=record.attempt,
                                   message=f"its controller ({handle}) ended without reporting the learner"
                                   + (f": {observed.reason}" if observed.reason else ""))
            key = self._coord.keys.learner_status(record.job_id, handle.rank)
            try:
                if self._coord.create(key, status.value()):
                    log.warning("job %s attempt %d: controller %d died before reporting; learner failed",
                                record.job_id, record.attempt, handle.rank)
                else:
                    current = LearnerStatus.parse_or_none(self._coord.get(key)[0])
                    if current is None or not current.final:
                        continue  # its leased status has yet to expire; look again next pass
            except TrainforgeError as e:
                log.debug("could not report controller %d of job %s: %s", handle.rank, record.job_id, e.message)
                continue
            reported.add(handle.rank)
        if reported != set(record.reported_dead):
            self._records.put(record.model_copy(update={"reported_dead": tuple(sorted(reported))}))

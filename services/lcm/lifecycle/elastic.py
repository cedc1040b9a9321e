"""Elastic jobs on the LCM's side: growing an attempt into the learners the Trainer granted it.

An elastic job (manifest `learners: {min, max}`) has `max` slots, ranks
0..max-1, each one learner (a torchrun agent node). The Trainer admits it
at its minimum, and the lifecycle starts it with that many, all or nothing
like any job. The Trainer grants it more learners as its admission pass
finds room that no queued job waits for (services/trainer/growth.py; the
LCM's GrowJob call records the grant). The pass here (`Growth.run_once`,
run with supervision) fills slots whose controller is gone or was never
started, up to the grant and as far as the backend's room and the team's
quota allow: growth never takes capacity the Trainer has not counted. A lost learner's slot is started
again only `REFILL_DELAY` seconds after the loss was seen: by then its
torchrun peers dropped the lost node and re-formed a smaller group, so the
new learner joins a settled rendezvous (and a slot that keeps failing is
not restarted in a tight loop). Meanwhile the slot's status says
LEARNER_PREPARING ("starting again"): the job's target size counts it, its
current size does not. It never adds learners once any learner finished, stores or halted,
or a halt was asked for: the job is ending.

The rendezvous store of the torchrun agents lives in slot 0's learner
(frameworks/torch/launch.py); losing slot 0 ends every agent's rendezvous,
so that loss fails the attempt (and goes through the restart policy).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainforge_services.common.adapters.etcd import Coordinator, FenceRefused
from trainforge_services.common.contracts.etcd import HaltRequest, LearnerStatus
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.states import LEARNER_EXITED_OK, LearnerState
from trainforge_services.lcm.backends.base import AttemptPlan, Backend, JobView, Role, TeamQuota
from trainforge_services.lcm.lifecycle.plan import with_learners
from trainforge_services.lcm.lifecycle.records import AttemptRecord
from trainforge_services.lcm.store import RecordStore

log = logging.getLogger(__name__)

_ENDING = LEARNER_EXITED_OK | {LearnerState.LEARNER_HALTED}
_UNLIMITED = 1 << 30
# Longer than the agents' keep-alive expiry plus a rendezvous round's last call (frameworks/torch/launch.py).
REFILL_DELAY = 12.0


@dataclass(frozen=True)
class Room:
    """What is free for one job: learners the backend may still run, its free GPU ids, and how many more
    learners of the job the team's quota allows."""

    learners: int
    gpus: list[int]
    quota: int


def quota_room(quota: TeamQuota | None, manifest: Manifest, held: list[tuple[Manifest, int]]) -> int:
    """How many more learners like `manifest`'s the team's quota allows while `held` (each attempt of the
    team here: its manifest and how many learners it runs) is in use. No quota: a large number."""
    if quota is None:
        return _UNLIMITED
    r = manifest.resources

    def total(field: str) -> float:
        return sum(getattr(m.resources, field) * n for m, n in held)

    limits = []
    if quota.gpus is not None and r.gpus:
        limits.append((quota.gpus - total("gpus")) // r.gpus)
    if r.gpu_type and r.gpus and r.gpu_type in quota.gpus_by_type:
        typed = sum(m.resources.gpus * n for m, n in held if m.resources.gpu_type == r.gpu_type)
        limits.append((quota.gpus_by_type[r.gpu_type] - typed) // r.gpus)
    if quota.cpus is not None:
        limits.append((quota.cpus - total("cpus")) // r.cpus)
    if quota.memory is not None:
        limits.append((quota.memory - total("memory")) // r.memory)
    return max(0, int(min(limits))) if limits else _UNLIMITED


def open_slots(plan: AttemptPlan, view: JobView) -> list[int]:
    """Slots (ranks < max) without a live controller: never started, or whose controller is gone."""
    alive = {o.handle.rank for o in view.processes if o.handle.role is Role.CONTROLLER and o.alive}
    return [r for r in range(plan.manifest.max_learners) if r not in alive]


class Growth:
    """Fills the open slots of running elastic attempts as room allows (one pass: `run_once`)."""

    def __init__(self, backend: Backend, coordinator: Coordinator, records: RecordStore[AttemptRecord],
                 job_lock: Callable[[str], threading.Lock], room: Callable[[AttemptRecord], Room],
                 attach: Callable[[AttemptPlan], AttemptPlan]):
        self._backend = backend
        self._attach = attach  # the plan with its credentials (lifecycle/credentials.py)
        self._coord = coordinator
        self._records = records
        self._job_lock = job_lock
        self._room = room
        self._unsupported = False
        # (job, attempt, slot) -> when its lost learner is started again
        self._refill_at: dict[tuple[str, int, int], float] = {}

    def run_once(self) -> None:
        if self._unsupported:
            return
        records = self._records.all()
        attempts = {(r.job_id, r.attempt) for r in records}
        self._refill_at = {k: v for k, v in self._refill_at.items() if k[:2] in attempts}
        for record in records:
            if not record.plan.manifest.elastic or record.killing:
                continue
            lock = self._job_lock(record.job_id)
            if not lock.acquire(blocking=False):
                continue  # a deploy or kill of this job is under way
            try:
                current = self._records.get(record.job_id)
                if current is not None and not current.killing:
                    self._grow(current)
            except NotImplementedError as e:
                log.warning("elastic jobs keep their starting size: %s", e)
                self._unsupported = True
                return
            except FenceRefused:
                raise  # deposed: this replica grows nothing more
            except TrainforgeError as e:
                log.info("job %s: not growing now: %s", record.job_id, e.message)
            finally:
                lock.release()

    def _ending(self, record: AttemptRecord) -> bool:
        """A learner finished, stores or halted, or a halt was asked: the attempt is ending, not growing."""
        halt = HaltRequest.parse_or_none(self._coord.get(self._coord.keys.halt(record.job_id))[0])
        if halt is not None and halt.attempt == record.attempt:
            return True
        values, _ = self._coord.list(self._coord.keys.learners(record.job_id))
        for value in values.values():
            status = LearnerStatus.parse_or_none(value)
            if status is not None and status.attempt == record.attempt and status.state in _ENDING:
                return True
        return False

    def _grow(self, record: AttemptRecord) -> None:
        plan = record.plan
        view = self._backend.observe(plan)
        if view.monitor_done or not view.names() >= plan.expected():
            return
        slots = open_slots(plan, view)
        if not slots or self._ending(record):
            return
        room = self._room(record)
        per = plan.manifest.resources.gpus
        running = plan.manifest.max_learners - len(slots)
        # what the Trainer granted (at least the minimum it admitted), less what runs
        allowed = max(record.granted, plan.manifest.min_learners) - running
        # a slot started before keeps its GPUs; a new one takes free ones
        add: list[int] = []
        gpus = list(room.gpus)
        by_rank: dict[int, list[int]] = {}
        for slot in slots:
            if len(add) >= min(room.learners, room.quota, allowed):
                break
            if slot < len(plan.learners):
                by_rank[slot] = list(plan.learners[slot].gpu_ids)
            elif len(gpus) >= per:
                by_rank[slot], gpus = gpus[:per], gpus[per:]
            else:
                break
            add.append(slot)
        add = self._due(record, add)
        if not add:
            return
        self._coord.confirm()  # nothing more starts once this replica was deposed
        grown = with_learners(plan, {slot: by_rank[slot] for slot in add})
        reported = tuple(r for r in record.reported_dead if r not in add)
        self._records.put(record.model_copy(update={"plan": grown, "reported_dead": reported}))
        log.info("job %s attempt %d: starting learner(s) %s (%d running, at most %d)", record.job_id,
                 record.attempt, ", ".join(map(str, add)), running, plan.manifest.max_learners)
        self._backend.launch_learners(self._attach(grown), add)

    def _due(self, record: AttemptRecord, slots: list[int]) -> list[int]:
        """The slots to start now: new ones, and lost ones whose refill delay is over (the others are marked
        as starting again and their delay begins)."""
        now = time.monotonic()
        due = []
        for slot in slots:
            if slot >= len(record.plan.learners):
                due.append(slot)
                continue
            key = (record.job_id, record.attempt, slot)
            at = self._refill_at.get(key)
            if at is None:
                self._refill_at[key] = now + REFILL_DELAY
                status = LearnerStatus(state=LearnerState.LEARNER_PREPARING, attempt=record.attempt,
                                       message=f"learner lost; a new one starts in {REFILL_DELAY:g}s, once the "
                                               "others re-formed their group")
                self._coord.put(self._coord.keys.learner_status(record.job_id, slot), status.value())
                log.info("job %s attempt %d: learner %d lost; starting it again in %gs", record.job_id,
                         record.attempt, slot, REFILL_DELAY)
            elif at <= now:
                del self._refill_at[key]
                due.append(slot)
        return due

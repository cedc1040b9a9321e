"""Acts on preemption decisions inside a dispatch pass: halts the victims and words both sides' reasons.

The dispatcher hands it each pass's plan when jobs wait; services/trainer/
preemption.py decides (pure), this module writes. A victim is moved
DEPLOYING/RUNNING -> HALTING through `Lifecycle.move`, the same path as a
user's halt (the RequestHalt rule asks the LCM; the learners save a final
checkpoint), with `preempted` naming why and `preempted_for` the waiting
job; once HALTED and its learners removed, the RequeuePreempted rule
(services/trainer/rules.py) queues it again, first in its team's queue. The
waiting job's history records the decision, and its queue reason says what
it waits for ("waiting for 2 GPUs being returned by preemption"). Every
decision is logged with its rationale.

A halt is never a kill: a victim that already left DEPLOYING/RUNNING when
the move is made (it ended, a user halted it) is simply skipped, and the
next pass decides again from what is then true.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from trainforge_services.common.states import JobState
from trainforge_services.trainer import admission, preemption
from trainforge_services.trainer.admission import Plan
from trainforge_services.trainer.cohorts import describe
from trainforge_services.trainer.preemption import Decision, Policy, Running
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.resources import BackendSize, Quota
from trainforge_services.trainer.rules import Lifecycle, RequestHalt
from trainforge_services.trainer.store import JobStore

log = logging.getLogger(__name__)

ACTOR = "scheduler"
# What a pass reads of active jobs for preemption (besides team, resources, gpu_type).
FIELDS = ("priority", "active_since", "preemptions", "preempted_for", "attempt")


def victim_reason(decision: Decision, victim: Running, quota: Quota | None = None) -> str:
    if decision.reclaim:
        return f"preempted: halted to return {describe(victim.need, quota)} to team {decision.team}"
    return f"preempted: halted for a higher-priority job ({decision.job_id} of team {decision.team})"


def waiting_reason(returned: admission.Usage, quota: Quota | None, halting: Iterable[str] = ()) -> str:
    names = sorted(halting)
    return (f"waiting for {describe(returned, quota)} being returned by preemption"
            + (f" (halting {', '.join(names)})" if names else ""))


class Preemptor:
    def __init__(self, store: JobStore, lifecycle: Lifecycle, policy: Policy,
                 clock: Callable[[], float] = time.time):
        self._store = store
        self._lifecycle = lifecycle
        self.policy = policy
        self._clock = clock

    def consider(self, result: Plan, queued: Mapping[str, JobRecord], active: Iterable[JobRecord],
                 quotas: Mapping[str, Quota], capacity: BackendSize,
                 as_queued: Mapping[str, admission.Queued] | None = None) -> None:
        """Halt what the waiting jobs of `result` need halted; rewrite their reasons in `result.wait`.
        `as_queued`: each queued job as admission sees it, where the caller keeps them (made here if not)."""
        if not result.wait or self.policy.max_preemptions <= 0:
            return
        now = self._clock()
        running = [_running(job, now) for job in active]
        running += [Running(j, queued[j].team, queued[j].resources, queued[j].priority, queued[j].gpu_type,
                            started=now) for j in result.dispatch]
        waiting = admission.queue_order(as_queued[j] if as_queued is not None else queued[j].queued()
                                        for j in result.wait)
        outcome = preemption.choose(waiting, running, quotas, capacity, self.policy, now)
        for job_id, returned in outcome.returning.items():
            quota = quotas.get(queued[job_id].team)
            result.wait[job_id] = (waiting_reason(returned, quota), result.wait[job_id][1])
        for decision in outcome.decisions:
            quota = quotas.get(decision.team)
            halted = [v for v in decision.victims if self._halt(decision, v, quota)]
            if not halted:
                continue
            returned = admission.total(v.need for v in halted)
            ids = [v.job_id for v in halted]
            why = "reclaiming its team's lent quota" if decision.reclaim else "higher priority"
            note = f"preempting {', '.join(ids)} ({why}) to free {describe(returned, quota)}"
            log.info("preemption: job %s of team %s: %s", decision.job_id, decision.team, note)
            waiting = queued[decision.job_id]
            self._store.note_event(decision.job_id, waiting.attempt, JobState.QUEUED, note, ACTOR)
            result.wait[decision.job_id] = (waiting_reason(returned, quota, ids), result.wait[decision.job_id][1])

    def _halt(self, decision: Decision, victim: Running, quota: Quota | None) -> bool:
        reason = victim_reason(decision, victim, quota)
        current = self._store.find(victim.job_id)
        if current is None or current.state not in RequestHalt.FROM:
            return False
        done = self._lifecycle.move(
            victim.job_id, JobState.HALTING, f"{reason}; the learners are checkpointing", ACTOR,
            attempt=current.attempt, only_from=RequestHalt.FROM,
            fields={"resumed": False, "preempted": reason, "preempted_for": decision.job_id,
                    "preemptions": current.preemptions + 1})
        if done.changed:
            log.info("preemption: job %s of team %s (priority %d, preempted %d time(s) before) %s; for job %s",
                     victim.job_id, victim.team, victim.priority, victim.preemptions, reason, decision.job_id)
        return done.changed


def _running(job: JobRecord, now: float) -> Running:
    # what halting it frees: an elastic job's grant too (services/trainer/growth.py)
    return Running(job.id, job.team, job.holds, job.priority, job.gpu_type,
                   started=job.active_since if job.active_since is not None else now,
                   preemptions=job.preemptions, haltable=job.state in RequestHalt.FROM,
                   leaving=job.state == JobState.HALTING, preempted_for=job.preempted_for)

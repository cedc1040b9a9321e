"""What a job's transitions mean beyond the state: named rules keyed by transition, in one place.

After Prefect's orchestration rules: each rule is a small class that says
which transitions it governs (`FROM` x `TO`) and what it does. A `before`
rule may turn a proposed transition into another one (a failed attempt
becomes a restart, or HALTED when the job was halting); an `after` rule
runs once the store committed the transition (it ran only for the one
writer that changed the state, so an effect never runs twice for one
transition). `Lifecycle.move` is the only way the service and the
dispatcher change a job's state: the store's compare-and-set, then the
rules. To change the restart or halt policy, change a rule here.

The rules act through `Actions` (implemented by `LcmCalls`,
services/trainer/lcmcalls.py: its pool of LCM calls, and the dispatcher's
wake-up), so they never call the LCM themselves and never wait on it. The
wiring (services/trainer/wiring.py) builds the `Actions` first, then the
`Lifecycle` over them, then binds the lifecycle to them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

from trainforge_services.common import states
from trainforge_services.common.states import JobState
from trainforge_services.trainer.attempts import next_attempt
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.store import JobStore, Transition

log = logging.getLogger(__name__)

ACTOR = "trainer"
# Longest wait before a restart, however many came before it.
MAX_BACKOFF = 600.0
ALL: frozenset[JobState] = frozenset(s for s in JobState if s != JobState.JOB_STATE_UNSPECIFIED)
_NOT_ACTIVE = ALL - states.ACTIVE
# Where an attempt ends while its learners may still run: the store marks it cleanup_pending on the way in.
_ATTEMPT_ENDED = states.TERMINAL | {JobState.HALTED, JobState.RESTARTING}


class Actions(Protocol):
    """What rules may ask for; none of it waits on the LCM."""

    def wake(self) -> None: ...

    def deploy(self, job: JobRecord) -> None: ...

    def halt(self, job: JobRecord) -> None: ...

    def clean_up(self, job_id: str) -> None: ...


@dataclass(frozen=True)
class Proposal:
    """A transition someone asks for; `before` rules may redirect it."""

    to: JobState
    reason: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    # a failure of the running attempt (the monitor saw it), which a restart policy may answer
    attempt_failed: bool = False
    # False when the failure is the job's own limit (its timeout): no restart policy answers it
    restartable: bool = True


class Rule:
    """Governs the transitions FROM x TO; `before` and `after` do nothing unless a rule overrides them."""

    FROM: ClassVar[frozenset[JobState]] = ALL
    TO: ClassVar[frozenset[JobState]] = ALL

    def covers(self, frm: JobState, to: JobState) -> bool:
        return frm in self.FROM and to in self.TO

    def before(self, job: JobRecord, proposal: Proposal) -> Proposal:
        return proposal

    def after(self, frm: JobState, job: JobRecord, actions: Actions) -> None:
        return None


class HaltedDespiteFailure(Rule):
    """A halting job whose attempt fails is HALTED: the checkpoints already stored are kept for a resume."""

    FROM = frozenset({JobState.HALTING})
    TO = frozenset({JobState.FAILED})

    def before(self, job: JobRecord, proposal: Proposal) -> Proposal:
        if not proposal.attempt_failed:
            return proposal
        return replace(proposal, to=JobState.HALTED, reason=f"halted, but not cleanly: {proposal.reason}; "
                       "resume continues from the last stored checkpoint")


class FinishedBeforeHalt(Rule):
    """A halting job whose learners all finished before the halt reached them completes: HALTING -> STORING.

    The reason says so (there is nothing left to resume), and a scheduler's halt no longer marks it preempted.
    """

    FROM = frozenset({JobState.HALTING})
    TO = frozenset({JobState.STORING})

    def before(self, job: JobRecord, proposal: Proposal) -> Proposal:
        return replace(proposal, reason=f"{proposal.reason}; the learners finished before the halt reached them, "
                                        "so the job completes instead of halting",
                       fields={**proposal.fields, "preempted": "", "preempted_for": ""})


class RestartOrFail(Rule):
    """A failed attempt restarts after `backoff * 2^(k-1)` (capped) while restarts are left; else FAILED."""

    FROM = frozenset({JobState.DEPLOYING, JobState.RUNNING})
    TO = frozenset({JobState.FAILED})

    def before(self, job: JobRecord, proposal: Proposal) -> Proposal:
        if not proposal.attempt_failed or not proposal.restartable:
            return proposal
        policy = job.spec().restart
        done = job.restarts
        if done >= policy.max_restarts:
            if not policy.max_restarts:
                return proposal
            return replace(proposal, reason=f"{proposal.reason}\n(no restarts left: {done} of "
                                            f"{policy.max_restarts} used)")
        delay = restart_delay(policy.backoff, done + 1)
        return replace(proposal, to=JobState.RESTARTING, fields={**proposal.fields, "restarts": done + 1,
                                                                   "restart_delay": delay},
                       reason=f"restart {done + 1} of {policy.max_restarts} in {delay:g}s after: {proposal.reason}")


class NoRestartLeft(Rule):
    """A failure outside DEPLOYING/RUNNING (e.g. while storing) ends the job, naming the restarts used."""

    FROM = ALL - {JobState.DEPLOYING, JobState.RUNNING, JobState.HALTING}
    TO = frozenset({JobState.FAILED})

    def before(self, job: JobRecord, proposal: Proposal) -> Proposal:
        policy = job.spec().restart if job.manifest else None
        if not proposal.attempt_failed or policy is None or not policy.max_restarts:
            return proposal
        return replace(proposal, reason=f"{proposal.reason}\n(no restarts left: {job.restarts} of "
                                        f"{policy.max_restarts} used)")


def restart_delay(backoff: float, k: int) -> float:
    """The wait before restart k (1-based): backoff, 2 x backoff, 4 x ..., at most MAX_BACKOFF."""
    return min(backoff * 2 ** (k - 1), MAX_BACKOFF)


class Deploy(Rule):
    """A reserved job's attempt is deployed (off the caller's thread)."""

    FROM = frozenset({JobState.QUEUED})
    TO = frozenset({JobState.DEPLOYING})

    def after(self, frm: JobState, job: JobRecord, actions: Actions) -> None:
        actions.deploy(job)


class RequestHalt(Rule):
    """HALTING asks the LCM to have the learners checkpoint and exit."""

    FROM = frozenset({JobState.DEPLOYING, JobState.RUNNING})
    TO = frozenset({JobState.HALTING})

    def after(self, frm: JobState, job: JobRecord, actions: Actions) -> None:
        actions.halt(job)


class CleanUpAttempt(Rule):
    """An attempt that ended (terminal, HALTED, RESTARTING) has its learners removed (KillJob).

    The store set `cleanup_pending` in the same update, so the next attempt
    is held back until the removal is recorded and two never overlap.
    """

    FROM = states.ACTIVE
    TO = _ATTEMPT_ENDED

    def after(self, frm: JobState, job: JobRecord, actions: Actions) -> None:
        if job.cleanup_pending:
            actions.clean_up(job.id)


class ReleaseResources(Rule):
    """Leaving the ACTIVE states frees capacity and quota: the queue is looked at again."""

    FROM = states.ACTIVE
    TO = _NOT_ACTIVE

    def after(self, frm: JobState, job: JobRecord, actions: Actions) -> None:
        actions.wake()


class QueueChanged(Rule):
    """A job entered the queue (admitted, resumed) or left it without running.

    A restart's requeue leaves the ACTIVE states: ReleaseResources wakes the dispatcher for it.
    """

    FROM = _NOT_ACTIVE
    TO = frozenset({JobState.QUEUED})

    def after(self, frm: JobState, job: JobRecord, actions: Actions) -> None:
        actions.wake()


class LeftQueue(QueueChanged):
    FROM = frozenset({JobState.PENDING, JobState.QUEUED})
    TO = states.TERMINAL


class RequeueAfterBackoff(Rule):
    """RESTARTING -> QUEUED as the next attempt once the failed one is removed, not before its backoff."""

    FROM = frozenset({JobState.RESTARTING})
    TO = frozenset({JobState.QUEUED})

    def proposal(self, job: JobRecord, now: float) -> Proposal:
        fields = {**next_attempt(job, not_before=now + job.restart_delay), "cleanup_pending": False}
        return Proposal(JobState.QUEUED, f"restart {job.restarts}: queued as attempt {job.attempt + 1}, "
                        "from the last checkpoint", fields)


class RequeuePreempted(Rule):
    """A job the scheduler halted for another (services/trainer/preemptor.py) comes back on its own.

    HALTED -> QUEUED as its next attempt, restoring its checkpoint, once its learners are removed (like a
    restart), and first of its priority in its team's queue (`preempted` stays set until it is dispatched).
    """

    FROM = frozenset({JobState.HALTED})
    TO = frozenset({JobState.QUEUED})

    @staticmethod
    def wanted(job: JobRecord) -> bool:
        return job.state == JobState.HALTED and bool(job.preempted)

    def proposal(self, job: JobRecord) -> Proposal:
        step = job.checkpoint_step
        where = f"from its checkpoint at step {step}" if step is not None else "from the start (no checkpoint)"
        fields = {**next_attempt(job, resumed=True), "cleanup_pending": False}
        return Proposal(JobState.QUEUED, f"{job.preempted}; requeued first in team {job.team}'s queue as attempt "
                        f"{job.attempt + 1}, continues {where}", fields)


class Announce(Rule):
    """Terminal and HALTED states are announced to the job's webhooks (enqueued to the notifier's outbox).

    Not in DEFAULT_RULES: the Trainer's wiring adds it with its notifier's `enqueue`.
    """

    TO = states.TERMINAL | {JobState.HALTED}

    def __init__(self, enqueue: Callable[[JobRecord], None]):
        self._enqueue = enqueue

    def after(self, frm: JobState, job: JobRecord, actions: Actions) -> None:
        self._enqueue(job)


DEFAULT_RULES: tuple[Rule, ...] = (HaltedDespiteFailure(), FinishedBeforeHalt(), RestartOrFail(), NoRestartLeft(), Deploy(),
                                   RequestHalt(), CleanUpAttempt(), ReleaseResources(), QueueChanged(),
                                   LeftQueue(), RequeueAfterBackoff())


class Lifecycle:
    """Applies a transition through the store, then the rules for it."""

    def __init__(self, store: JobStore, actions: Actions, rules: Sequence[Rule] = DEFAULT_RULES,
                 clock: Callable[[], float] = time.time):
        self._store = store
        self._actions = actions
        self._rules = tuple(rules)
        self._clock = clock

    def rules_for(self, frm: JobState, to: JobState) -> list[Rule]:
        return [r for r in self._rules if r.covers(frm, to)]

    def propose(self, job: JobRecord, proposal: Proposal) -> Proposal:
        """The transition `proposal` becomes for `job` as it is now (the `before` rules, in order)."""
        # keyed by the transition asked for: a redirected proposal is not offered to more rules
        for rule in self.rules_for(job.state, proposal.to):
            proposal = rule.before(job, proposal)
        return proposal

    def move(self, job_id: str, to: JobState, reason: str, actor: str, *, attempt: int | None = None,
             only_from: Iterable[JobState] | None = None, fields: Mapping[str, Any] | None = None,
             fence: int | None = None, seen: JobRecord | None = None, read: Mapping | None = None) -> Transition:
        """`store.apply_transition`, then the `after` rules of the transition it made (if it made one).

        `fence`: the dispatcher leader's term, for a reservation among replicas (services/trainer/fence.py);
        `seen`: the job as the dispatcher's copy holds it (one round trip when still true);
        `read`: the job's document as the caller just read it (`JobStore.find_document`; the same).
        """
        # a store twin without replicas takes none of them
        extra = {**({"fence": fence} if fence is not None else {}), **({"seen": seen} if seen is not None else {}),
                 **({"read": read} if read is not None else {})}
        done = self._store.apply_transition(job_id, to, reason, actor or ACTOR, attempt=attempt,
                                            set_fields=fields, only_from=only_from, **extra)
        if done.changed and done.job is not None:
            self.committed(done.job)
        return done

    def committed(self, job: JobRecord) -> None:
        """Run the `after` rules of the transition that made `job` (its last history entry)."""
        frm = job.history[-1].from_state if job.history else JobState.JOB_STATE_UNSPECIFIED
        for rule in self.rules_for(frm, job.state):
            try:
                rule.after(frm, job, self._actions)
            except Exception:
                # the transition is committed; a failed effect is picked up by the dispatcher's scans
                log.exception("job %s: rule %s after %s -> %s failed", job.id, type(rule).__name__, frm.name,
                              job.state.name)

    def cleaned_up(self, job: JobRecord) -> None:
        """The attempt's learners are gone: a restarting or preempted job is requeued, any other one marked clean."""
        requeue: RequeueAfterBackoff | RequeuePreempted = RequeueAfterBackoff()
        if RequeuePreempted.wanted(job):
            requeue = RequeuePreempted()
            proposal = requeue.proposal(job)
        elif requeue.covers(job.state, JobState.QUEUED):
            proposal = requeue.proposal(job, self._clock())
        else:
            self._store.cleanup_done(job.id, job.attempt)
            return
        done = self.move(job.id, proposal.to, proposal.reason, ACTOR, attempt=job.attempt,
                         only_from=requeue.FROM, fields=proposal.fields)
        if not done.changed:
            self._store.cleanup_done(job.id, job.attempt)  # cancelled meanwhile: nothing to requeue

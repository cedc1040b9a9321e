"""A job as the Trainer knows it: one frozen, typed record.

`JobRecord` is what the store hands out and what the service, the rules,
the dispatcher and the gRPC API (grpc_api.py) read; none of them sees a MongoDB document.
services/trainer/storedocs.py is the one place a record is made from a document
(and a change written back), so a field renamed in the store moves in one
file. A record read with a projection (a dispatch pass reads only what it
needs of the queue) leaves the fields it did not read at their defaults.

`manifest` is the manifest as stored (JSON-ready, the wire's
`manifest_json`); `spec()` parses it into the typed `Manifest`.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict

from trainforge_services.common.manifest import Manifest, parse_manifest
from trainforge_services.common.states import JobState
from trainforge_services.trainer.resources import Queued, Usage

# JobRecord.gate: a prestarted trial's learners wait ("closed") until the experiment driver lets them ("open")
GATE_CLOSED = "closed"
GATE_OPEN = "open"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)


class StatusEvent(_Frozen):
    """One entry of a job's history: a transition, why, who made it and when (unix seconds)."""

    from_state: JobState
    to_state: JobState
    reason: str = ""
    actor: str = ""
    ts: float = 0.0
    # the entry that reserved the job's resources: what that stint holds on borrowed quota
    borrowed: Usage = Usage()
    # a grant to an elastic attempt (services/trainer/growth.py): all it holds beyond its minimum from this
    # entry on (None: not a grant's entry)
    grown: Usage | None = None


class LearnerReport(_Frozen):
    """What the job monitor last reported of one learner (state is a LearnerState value)."""

    rank: int
    state: int = 0
    exit_code: int = 0
    attempt: int = 0
    message: str = ""
    isolation: str = ""  # "sandbox", "userns", "container" or "none" once the learner started (docs/THREAT_MODEL.md)
    timed_out: bool = False  # the manifest's timeout ended it


class JobRecord(_Frozen):
    id: str
    team: str = ""
    name: str = ""
    state: JobState = JobState.JOB_STATE_UNSPECIFIED
    reason: str = ""
    attempt: int = 1
    manifest: dict[str, Any] = {}
    code_uri: str = ""
    submitted_by: str = ""
    idempotency_key: str = ""
    priority: int = 1
    # the term of the dispatcher leader that last stamped it (services/trainer/fence.py); 0: none
    fence: int = 0
    # what the job holds while ACTIVE: all its learners together (an elastic job: at its minimum)
    resources: Usage = Usage()
    # an elastic job: its manifest's max learners (0: a fixed size), the learners granted to its current
    # attempt beyond the minimum (services/trainer/growth.py), and since when it holds that grant
    max_learners: int = 0
    grown: Usage = Usage()
    grown_since: float | None = None
    gpu_type: str = ""
    queue_position: int = 0
    # restarts made so far, the backoff chosen for the next one, and the earliest time it may deploy
    restarts: int = 0
    restart_delay: float = 0.0
    not_before: float = 0.0
    checkpoint_uri: str = ""
    checkpoint_step: int | None = None
    resumed: bool = False
    # the learners of an attempt that left the ACTIVE states may still run until KillJob succeeds
    cleanup_pending: bool = False
    learners: dict[str, LearnerReport] = {}
    outputs_uri: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    # when a write the dispatcher's copy follows last changed it (services/trainer/store_reads.py `changed_since`)
    changed_at: float = 0.0
    active_since: float | None = None
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    # a trial of an experiment (services/trainer/experiments/): its id and the trial's index; "" / -1 otherwise
    experiment_id: str = ""
    trial: int = -1
    # a trial started ahead of its slot (docs/EXPERIMENTS.md, "Prestarted trials"): "closed" while its learners
    # must wait before starting (deployed with `gated`), "open" once the experiment driver let them; "" for
    # every other job. Only ever moves "closed" -> "open".
    gate: str = ""
    # what the job holds beyond its team's own quota, borrowed in `cohort` when it was dispatched
    borrowed: Usage = Usage()
    cohort: str = ""
    # times the scheduler halted it for another job; why, while that halt and its requeue are under way
    # (a job requeued after a preemption is first in its team's queue until it is dispatched again)
    preemptions: int = 0
    preempted: str = ""
    preempted_for: str = ""
    # oldest first
    history: tuple[StatusEvent, ...] = ()

    @property
    def holds(self) -> Usage:
        """What the job holds while ACTIVE: its admitted resources and what growth was granted."""
        return self.resources + self.grown

    def spec(self) -> Manifest:
        """The manifest as the typed model (only on a record read with its manifest)."""
        return parse_manifest(self.manifest)

    def queued(self) -> Queued:
        """What admission needs to place this job in the queue."""
        return Queued(self.id, self.team, self.resources, self.priority, self.created_at, self.gpu_type,
                      front=bool(self.preempted))

    def held_back(self, now: float) -> str:
        """Why this QUEUED job may not be dispatched yet ("": it may): its previous attempt's learners are not
        removed, or its restart backoff has not run out."""
        if self.cleanup_pending:
            return "waiting for the previous attempt's learners to be removed"
        if self.not_before > now:
            at = time.strftime("%H:%M:%S", time.localtime(self.not_before))
            return f"restart {self.restarts}: waiting out the backoff until {at}"
        return ""

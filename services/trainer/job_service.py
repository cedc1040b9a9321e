"""What the Trainer's RPCs mean, free of gRPC.

Each public method is one use case (submit, cancel, a monitor's report,
setting a quota, a usage report...) over the stores, the dispatcher (the
capacity it knows, a wake-up) and the LCM calls (services/trainer/
lcmcalls.py); services/trainer/grpc_api.py only converts messages. The
wiring (services/trainer/wiring.py) hands it the same rules' `Lifecycle`
and `LcmCalls` as the dispatcher. Every transition made
here goes through `Lifecycle.move` (services/trainer/rules.py): the store's
compare-and-set, then the rules for that transition (restart or fail,
request the halt, remove the learners, look at the queue again), so no
policy lives here and none is forgotten.

Submit refuses, before anything is stored, a job that names an object its
team may not read (services/trainer/storerefs.py) and a job that could never
run: one bigger than the backend or than its team's whole quota. A retried submit
(same team and idempotency key) returns the first job; the store's unique
index decides between concurrent retries, so there is never a second one.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from trainforge_services.common import states
from trainforge_services.common.contracts.ids import check_job_id, new_job_id
from trainforge_services.common.errors import Conflict, InvalidArgument, NotFound, PermissionDenied
from trainforge_services.common.manifest import Manifest, parse_manifest
from trainforge_services.common.states import JobState
from trainforge_services.trainer import accounting, admission, cohorts
from trainforge_services.trainer.accounting import ClusterView, TeamReport
from trainforge_services.trainer.attempts import next_attempt
from trainforge_services.trainer.dispatcher import Dispatcher
from trainforge_services.trainer.jobmirror import EXACT_MARGIN, MARGIN
from trainforge_services.trainer.lcmcalls import LcmCalls
from trainforge_services.trainer.quotas import QuotaStore
from trainforge_services.trainer.record import JobRecord, LearnerReport
from trainforge_services.trainer.resources import Quota
from trainforge_services.trainer.rules import ACTOR, Lifecycle, Proposal, RequestHalt
from trainforge_services.trainer.stamps import STAMPS
from trainforge_services.trainer.store import AlreadySubmitted, JobStore
from trainforge_services.trainer.storerefs import StoreRefs

log = logging.getLogger(__name__)

# what may be halted is the halt rule's to say
_HALTABLE = RequestHalt.FROM
DEFAULT_LIMIT = 100
# one more than the API's largest page (1000), so it can tell whether another page follows
MAX_LIMIT = 1001
_FIELDS = {"gpus": "resources.gpus", "cpus": "resources.cpus", "memory": "resources.memory",
           "learners": "learners", "gpu_type": "resources.gpu_type", "jobs": "team"}
# The reason a newly submitted job waits with until a pass gives it its own.
_ADMITTED = "admitted; waiting for the dispatcher"
# The API accepts Idempotency-Key headers of up to 255 characters.
_MAX_KEY = 255


class Listing(NamedTuple):
    jobs: list[JobRecord]
    # a time to pass back as `changed_after` so that the next listing misses no change since this one
    as_of: float


def listing_as_of(*, sole_writer: bool) -> float:
    """The `as_of` of a listing about to read (`JobService.list` says why it is safe): what `STAMPS` has
    settled, less `EXACT_MARGIN` when this process is the only writer of the jobs, else less `MARGIN`."""
    return max(STAMPS.settled() - (EXACT_MARGIN if sole_writer else MARGIN), 0.0)


class JobService:
    def __init__(self, store: JobStore, lifecycle: Lifecycle, calls: LcmCalls, dispatcher: Dispatcher,
                 quotas: QuotaStore, refs: StoreRefs):
        self._store = store
        self.refs = refs
        self._lifecycle = lifecycle
        self._calls = calls
        self._dispatcher = dispatcher
        self._quotas = quotas

    def submit(self, team: str, manifest_source: str, *, code_uri: str = "", submitted_by: str = "",
               job_id: str = "", idempotency_key: str = "", experiment_id: str = "",
               trial: int = -1, gated: bool = False) -> JobRecord:
        """Validate and persist a job, admitted (QUEUED, its history PENDING -> QUEUED) in the same write.

        The dispatcher takes it from there.

        With an idempotency key, a team's second submit returns its first
        job (Conflict when the manifest differs), however the two race.
        """
        if not team:
            raise InvalidArgument("team is required", details=[{"field": "team", "message": "required"}])
        if len(idempotency_key) > _MAX_KEY:
            message = f"must be at most {_MAX_KEY} characters"
            raise InvalidArgument(f"idempotency_key: {message}",
                                  details=[{"field": "idempotency_key", "message": message}])
        job_id = check_job_id(job_id or new_job_id())
        manifest = parse_manifest(manifest_source)
        # every object the job names is one its team may read (services/common/storeaccess.py)
        self.refs.reads(team, manifest, job_id=job_id, code_uri=code_uri)
        try:
            self.refuse_if_never_fits(team, manifest)
        except InvalidArgument:
            # a retry of a job accepted before (its quota lowered since, say) still returns that job
            if idempotency_key and (first := self._store.find_by_key(team, idempotency_key)) is not None:
                return self._resubmitted(first, manifest, idempotency_key)
            raise
        # One write: the job inserted already admitted (QUEUED, with its PENDING history entry), not an
        # insert and then the admission's read and compare-and-set. A retry with the same idempotency key
        # is told apart by the store's unique index, not by a read before every insert.
        try:
            job = self._store.insert(job_id, team, manifest, code_uri=code_uri, submitted_by=submitted_by,
                                     idempotency_key=idempotency_key, experiment_id=experiment_id, trial=trial,
                                     admitted=_ADMITTED, gated=gated)
        except AlreadySubmitted as e:  # submitted before, or a concurrent retry inserted first
            return self._resubmitted(e.job, manifest, idempotency_key)
        self._lifecycle.committed(job)  # PENDING -> QUEUED's rules: the dispatcher is woken
        return job

    def _resubmitted(self, first: JobRecord, manifest: Manifest, key: str) -> JobRecord:
        # compared as models, so a manifest stored before a field was added still matches
        if first.spec() != manifest:
            raise Conflict(f"idempotency key {key!r} was already used for job {first.id!r} with a "
                           "different manifest", details=[{"field": "idempotency_key", "message": "reused"}])
        if first.state == JobState.PENDING:
            # a job inserted PENDING (before admission at insert) whose submit died before admitting it
            return self._admit(first.id, _ADMITTED)
        return first

    def refuse_if_never_fits(self, team: str, manifest: Manifest) -> None:
        """InvalidArgument naming each resource when the job is bigger than the backend or the team's quota."""
        need = admission.demand(manifest)
        gpu_type = manifest.resources.gpu_type or ""
        problems = {}
        capacity = self._dispatcher.capacity()
        if capacity is not None:  # unknown now: the dispatcher refuses it once the LCM answers
            problems.update(admission.too_big(need, capacity))
        quota = self._quotas.get(team)
        if quota.cohort:  # what borrowing in its cohort could ever give it
            quota = cohorts.ceilings(self._quotas.all()).get(team, quota)
        for resource, message in admission.beyond_quota(need, gpu_type, quota).items():
            problems[resource] = f"{problems[resource]}; {message}" if resource in problems else message
        if problems:
            raise InvalidArgument("; ".join(problems.values()),
                                  details=[{"field": _FIELDS[r], "message": m} for r, m in problems.items()])

    def _admit(self, job_id: str, reason: str) -> JobRecord:
        job = self._lifecycle.move(job_id, JobState.QUEUED, reason, ACTOR, only_from=[JobState.PENDING]).job
        if job is None:  # cancelled between insert and admission
            job = self._store.find(job_id)
        if job is None:
            raise NotFound(f"job {job_id!r} not found")
        return job

    # -- quotas and usage --------------------------------------------------

    def set_quota(self, team: str, quota: Quota, actor: str) -> TeamReport:
        """Replace a team's quota; the next dispatch pass applies it (running jobs keep running)."""
        self._quotas.put(team, quota, actor or "admin")
        log.info("team %s: quota set by %s: %s", team, actor or "admin", quota)
        self._calls.sync_team(team, quota)
        self._dispatcher.wake()
        return self.team_usage(team)

    def team_usage(self, team: str) -> TeamReport:
        """A team's quota, what its active jobs hold, its queue and what it has consumed."""
        if not team:
            raise InvalidArgument("team is required", details=[{"field": "team", "message": "required"}])
        quota = self._quotas.get(team)
        return accounting.reports(self._store.usage_rows(team), {team: quota}, time.time())[0]

    def list_usage(self) -> list[TeamReport]:
        """Every team that has a quota or any job, by name."""
        return accounting.reports(self._store.usage_rows(), self._quotas.all(), time.time())

    def cluster(self) -> ClusterView:
        """The backend's capacity as the LCM last reported it (asked again off this thread when older than a
        second: `Dispatcher.capacity_viewed`) and what every team holds."""
        reports = self.list_usage()
        held = sum((r.held.usage for r in reports), admission.Usage())
        capacity = self._dispatcher.capacity_viewed()
        return ClusterView(capacity=capacity, unknown_reason="" if capacity else self._dispatcher.capacity_problem,
                           held=held, active_jobs=sum(r.active_jobs for r in reports),
                           queued_jobs=sum(r.queued_jobs for r in reports))

    def get(self, team: str, job_id: str) -> JobRecord:
        return self._store.get(team, job_id)

    def list(self, team: str, *, states_filter: list[JobState] | None = None, limit: int = 0,
             changed_after: float = 0.0, **filters: Any) -> Listing:
        """A team's jobs, newest first, and the listing's `as_of`; `filters` are JobStore.list's (name,
        created_after/before, before), `changed_after` only the jobs changed at or after it (0: all).

        `as_of` is taken before the read, so a follower that passes it back as `changed_after` misses no
        change: a write is stamped before the store applies it, and one stamped before this read may commit
        after it. Every job write of this process stamped before `STAMPS.settled()` was acknowledged before
        the read began (services/trainer/stamps.py); less `EXACT_MARGIN` for the wall clock's small steps,
        as the dispatcher's copy does (services/trainer/jobmirror.py). With leader election other replicas
        write too, and their stamps out are not known here: then `MARGIN` before it, the bound that copy
        relies on for writes it cannot see. A job may come back in two listings; none is missed. Only the
        writes that stamp `changed_at` count (services/trainer/store.py): a queue note (a waiting job's
        reason and position) brings nothing back."""
        if changed_after < 0 or changed_after != changed_after or changed_after == float("inf"):
            raise InvalidArgument("changed_after must be a finite time, 0 or later",
                                  details=[{"field": "changed_after", "message": "must be finite and >= 0"}])
        if limit < 0:
            raise InvalidArgument("limit must not be negative",
                                  details=[{"field": "limit", "message": "must be >= 0"}])
        unknown = [s for s in states_filter or [] if s == JobState.JOB_STATE_UNSPECIFIED]
        if unknown:
            raise InvalidArgument("states: JOB_STATE_UNSPECIFIED is not a state a job can be in",
                                  details=[{"field": "states", "message": "unspecified state"}])
        limit = min(limit or DEFAULT_LIMIT, MAX_LIMIT)
        as_of = listing_as_of(sole_writer=self._dispatcher.sole_writer)
        jobs = self._store.list(team, states_filter=states_filter or [], limit=limit, changed_after=changed_after,
                                **filters)
        return Listing(jobs, as_of)

    def cancel(self, team: str, job_id: str, actor: str) -> JobRecord:
        """Any non-terminal job ends CANCELLED; cancelling it again returns it unchanged."""
        job = self._store.get(team, job_id)
        reason = f"cancelled by {actor or 'user'}"
        done = self._lifecycle.move(job_id, JobState.CANCELLED, reason, actor or "user")
        if done.changed and done.job is not None:
            return done.job
        current = done.job or self._store.find(job_id) or job
        if current.state == JobState.CANCELLED:
            return current
        state = current.state.name.lower()
        raise Conflict(f"job {job_id!r} already {state}; only a job that has not ended can be cancelled")

    def halt(self, team: str, job_id: str, actor: str) -> JobRecord:
        """DEPLOYING/RUNNING -> HALTING (the RequestHalt rule asks the LCM); HALTING or HALTED again is a no-op."""
        job = self._store.get(team, job_id)
        who = actor or "user"
        done = self._lifecycle.move(job_id, JobState.HALTING,
                                    f"halt requested by {who}; the learners are checkpointing", who,
                                    attempt=job.attempt, only_from=_HALTABLE, fields={"resumed": False})
        if done.changed and done.job is not None:
            return done.job
        current = done.job or self._store.find(job_id) or job
        state = current.state
        if state in (JobState.HALTING, JobState.HALTED) and current.preempted:
            # halted by the scheduler: now the user's halt, so it stays halted instead of coming back
            current = self._store.set_fields(job_id, {"preempted": "", "preempted_for": ""}, state=state,
                                             attempt=current.attempt) or current
        if state in (JobState.HALTING, JobState.HALTED):
            return current
        if state in (JobState.PENDING, JobState.QUEUED):
            why = "is waiting in the queue and has nothing to checkpoint; cancel it, or halt it once it runs"
        elif state == JobState.RESTARTING:
            why = "is restarting after a failure; halt it once it runs again"
        else:
            why = f"is already {state.name.lower()}; only a deploying or running job can be halted"
        raise Conflict(f"job {job_id!r} {why}")

    def resume(self, team: str, job_id: str, actor: str) -> JobRecord:
        """HALTED -> QUEUED as the next attempt, restoring the checkpoint; repeating it is a no-op."""
        job = self._store.get(team, job_id)
        who = actor or "user"
        state = job.state
        if state != JobState.HALTED:
            if job.resumed and not states.is_terminal(state) and state != JobState.HALTING:
                return job  # a retried resume
            raise Conflict(f"job {job_id!r} is {state.name.lower()}; only a halted job can be resumed")
        step = job.checkpoint_step
        where = f"from its checkpoint at step {step}" if step is not None else "from the start (no checkpoint)"
        done = self._lifecycle.move(
            job_id, JobState.QUEUED, f"resumed by {who}; continues {where}", who, attempt=job.attempt,
            only_from=[JobState.HALTED], fields=next_attempt(job, resumed=True))
        if done.changed and done.job is not None:
            return done.job
        return self.resume(team, job_id, actor)  # lost a race with another resume or a cancel: look again

    def open_gate(self, job_id: str, actor: str) -> JobRecord | None:
        """Let a gated job's learners start (docs/EXPERIMENTS.md, "Prestarted trials"); the job, or None when its
        gate was not closed. Written first, then acted on: a DEPLOYING job's LCM is told now (retried), a job not
        deployed yet is deployed ungated, and a deploy that races this (or is resent after a restart) opens the
        gate again once it answered (services/trainer/lcmcalls.py)."""
        job = self._store.open_gate(job_id)
        if job is None:
            return None
        log.info("job %s: gate opened by %s (%s, attempt %d)", job_id, actor, job.state.name, job.attempt)
        if job.state == JobState.DEPLOYING:
            self._calls.open_gate(job)
        return job

    def report(self, job_id: str, attempt: int, state: JobState, reason: str, actor: str, *,
               learners: dict[str, LearnerReport] | None = None, outputs_uri: str = "",
               checkpoint_step: int | None = None, by_job: bool = False) -> JobRecord:
        """A state seen by the job monitor (or the LCM); stale, repeated and illegal ones change nothing.

        `by_job`: the report came with the job's own credential (its monitor's token), which is revoked once
        the job has ended and its learners are removed: PermissionDenied then.

        A failed attempt is offered to the rules (services/trainer/rules.py):
        RESTARTING while the manifest allows another restart, HALTED when the
        job was halting (what was stored is kept), else FAILED.
        """
        if state == JobState.JOB_STATE_UNSPECIFIED:
            raise InvalidArgument("state is required", details=[{"field": "state", "message": "required"}])
        found = self._store.find_document(job_id)
        if found is None:
            raise NotFound(f"job {job_id!r} not found")
        before, doc = found
        if by_job and states.is_terminal(before.state) and not before.cleanup_pending:
            raise PermissionDenied(f"job {job_id} has ended and its learners are removed: its own credentials "
                                   "are revoked")
        if attempt and attempt != before.attempt:
            log.info("job %s: ignored %s for attempt %d; current attempt is %d", job_id, state.name, attempt,
                     before.attempt)
            return before
        fields: dict[str, Any] = {}
        if learners:
            fields["learners"] = learners
        if outputs_uri:
            fields["outputs_uri"] = outputs_uri
        if checkpoint_step is not None:
            fields["checkpoint_step"] = checkpoint_step
        # a learner stopped by the manifest's timeout ends the job: a restart would only run out of time again
        timed_out = any(s.timed_out for s in (learners or {}).values())
        proposal = self._lifecycle.propose(before, Proposal(state, reason, fields,
                                                            attempt_failed=state == JobState.FAILED,
                                                            restartable=not timed_out))
        # the transition writes on the document just read (one round trip less per report; if it moved on
        # meanwhile, the store reads it again and decides as before)
        done = self._lifecycle.move(job_id, proposal.to, proposal.reason, actor or "monitor",
                                    attempt=before.attempt, fields=proposal.fields, read=doc)
        if done.changed and done.job is not None:
            return done.job
        if done.job is None:
            current = self._store.find(job_id) or before
            log.info("job %s: ignored report %s -> %s (%s): not a legal transition", job_id,
                     current.state.name, proposal.to.name, proposal.reason)
            return current
        # the same state again: only what the monitor saw of the learners may have moved on, and while
        # DEPLOYING the reason is the learners' preparing progress (written only while still DEPLOYING)
        if proposal.to == JobState.DEPLOYING and proposal.reason and proposal.reason != done.job.reason:
            fields["reason"] = proposal.reason
        if any(getattr(done.job, k) != v for k, v in fields.items()):
            return self._store.set_fields(job_id, fields, state=proposal.to, attempt=before.attempt) or done.job
        return done.job

    def reconcile(self) -> None:
        """After a restart: finish admissions a crash interrupted and resend deployments it may have lost."""
        for job in self._store.in_states([JobState.PENDING]):
            self._lifecycle.move(job.id, JobState.QUEUED, "admitted after a Trainer restart", ACTOR,
                                 only_from=[JobState.PENDING])
            log.info("job %s: admitted after restart", job.id)
        for job in self._store.in_states([JobState.DEPLOYING]):
            log.info("job %s: resending deploy of attempt %d after restart", job.id, job.attempt)
            self._calls.deploy(job)
        for job in self._store.in_states([JobState.HALTING]):
            log.info("job %s: resending the halt of attempt %d after restart", job.id, job.attempt)
            self._calls.halt(job)
        # cleanups (and the requeue of RESTARTING jobs) are picked up by the dispatcher's passes
        self._dispatcher.wake()

    def health(self) -> str:
        self._store.ping()
        return "ok"

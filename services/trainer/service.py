"""What the Trainer's RPCs mean, free of gRPC.

Each public method is one use case (submit, cancel, a monitor's report,
setting a quota, a usage report...) over the stores and the dispatcher;
services/trainer/servicer.py only converts messages. Every transition made
here goes through `_after_change`, so no terminal one forgets to remove the
learners or to look at the queue again.

Submit refuses, before anything is stored, a job that could never run: one
bigger than the backend or than its team's whole quota. A retried submit
(same team and idempotency key) returns the first job; the store's unique
index decides between concurrent retries, so there is never a second one.
"""

from __future__ import annotations

import logging
import time

from services.common import states
from services.common.contracts.ids import check_job_id, new_job_id
from services.common.errors import Conflict, InvalidArgument, NotFound
from services.common.manifest import Manifest, parse_manifest
from services.common.states import JobState
from services.trainer import accounting, admission
from services.trainer.accounting import TeamReport
from services.trainer.admission import Quota
from services.trainer.attempts import next_attempt
from services.trainer.dispatcher import Dispatcher
from services.trainer.quotas import QuotaStore
from services.trainer.store import AlreadySubmitted, JobStore

log = logging.getLogger(__name__)

ACTOR = "trainer"
# Longest wait before a restart, however many came before it.
MAX_BACKOFF = 600.0
_HALTABLE = (JobState.DEPLOYING, JobState.RUNNING)
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_FIELDS = {"gpus": "resources.gpus", "cpus": "resources.cpus", "memory": "resources.memory",
           "learners": "learners", "gpu_type": "resources.gpu_type", "jobs": "team"}
# The API accepts Idempotency-Key headers of up to 255 characters.
_MAX_KEY = 255


class JobService:
    def __init__(self, store: JobStore, dispatcher: Dispatcher, quotas: QuotaStore):
        self._store = store
        self._dispatcher = dispatcher
        self._quotas = quotas

    def submit(self, team: str, manifest_source: str, *, code_uri: str = "", submitted_by: str = "",
               job_id: str = "", idempotency_key: str = "") -> dict:
        """Validate, persist (PENDING) and admit (QUEUED) a job; the dispatcher takes it from there.

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
        if idempotency_key and (first := self._store.find_by_key(team, idempotency_key)) is not None:
            return self._resubmitted(first, manifest, idempotency_key)
        self._refuse_if_never_fits(team, manifest)
        try:
            self._store.insert(job_id, team, manifest, code_uri=code_uri, submitted_by=submitted_by,
                               idempotency_key=idempotency_key)
        except AlreadySubmitted as e:  # a concurrent retry inserted first
            return self._resubmitted(e.doc, manifest, idempotency_key)
        doc = self._admit(job_id, "admitted; waiting for the dispatcher")
        self._dispatcher.wake()
        return doc

    def _resubmitted(self, first: dict, manifest: Manifest, key: str) -> dict:
        # compared as models, so a manifest stored before a field was added still matches
        if parse_manifest(first.get("manifest") or {}) != manifest:
            raise Conflict(f"idempotency key {key!r} was already used for job {first['_id']!r} with a "
                           "different manifest", details=[{"field": "idempotency_key", "message": "reused"}])
        if JobState(first["state"]) == JobState.PENDING:
            # the first submit may have died between insert and admission; finish it
            return self._admit(first["_id"], "admitted; waiting for the dispatcher")
        return first

    def _refuse_if_never_fits(self, team: str, manifest: Manifest) -> None:
        need = admission.demand(manifest)
        gpu_type = manifest.resources.gpu_type or ""
        problems = {}
        capacity = self._dispatcher.capacity()
        if capacity is not None:  # unknown now: the dispatcher refuses it once the LCM answers
            problems.update(admission.too_big(need, capacity))
        for resource, message in admission.beyond_quota(need, gpu_type, self._quotas.get(team)).items():
            problems[resource] = f"{problems[resource]}; {message}" if resource in problems else message
        if problems:
            raise InvalidArgument("; ".join(problems.values()),
                                  details=[{"field": _FIELDS[r], "message": m} for r, m in problems.items()])

    def _admit(self, job_id: str, reason: str) -> dict:
        doc = self._store.transition(job_id, JobState.QUEUED, reason, ACTOR, only_from=[JobState.PENDING])
        if doc is None:  # cancelled between insert and admission
            doc = self._store.find(job_id)
        if doc is None:
            raise NotFound(f"job {job_id!r} not found")
        return doc

    # -- quotas and usage --------------------------------------------------

    def set_quota(self, team: str, quota: Quota, actor: str) -> TeamReport:
        """Replace a team's quota; the next dispatch pass applies it (running jobs keep running)."""
        self._quotas.put(team, quota, actor or "admin")
        log.info("team %s: quota set by %s: %s", team, actor or "admin", quota)
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

    def get(self, team: str, job_id: str) -> dict:
        return self._store.get(team, job_id)

    def list(self, team: str, *, states_filter: list[JobState] | None = None, limit: int = 0) -> list[dict]:
        if limit < 0:
            raise InvalidArgument("limit must not be negative",
                                  details=[{"field": "limit", "message": "must be >= 0"}])
        unknown = [s for s in states_filter or [] if s == JobState.JOB_STATE_UNSPECIFIED]
        if unknown:
            raise InvalidArgument("states: JOB_STATE_UNSPECIFIED is not a state a job can be in",
                                  details=[{"field": "states", "message": "unspecified state"}])
        limit = min(limit or DEFAULT_LIMIT, MAX_LIMIT)
        return self._store.list(team, states_filter=states_filter or [], limit=limit)

    def cancel(self, team: str, job_id: str, actor: str) -> dict:
        """Any non-terminal job ends CANCELLED; cancelling it again returns it unchanged."""
        doc = self._store.get(team, job_id)
        reason = f"cancelled by {actor or 'user'}"
        done = self._store.apply_transition(job_id, JobState.CANCELLED, reason, actor or "user")
        if done.changed:
            self._after_change(done.doc)
            return done.doc
        current = done.doc or self._store.find(job_id) or doc
        if JobState(current["state"]) == JobState.CANCELLED:
            return current
        state = JobState(current["state"]).name.lower()
        raise Conflict(f"job {job_id!r} already {state}; only a job that has not ended can be cancelled")

    def halt(self, team: str, job_id: str, actor: str) -> dict:
        """DEPLOYING/RUNNING -> HALTING and the LCM's halt request; HALTING or HALTED again is a no-op."""
        doc = self._store.get(team, job_id)
        who = actor or "user"
        done = self._store.apply_transition(job_id, JobState.HALTING,
                                            f"halt requested by {who}; the learners are checkpointing", who,
                                            attempt=doc["attempt"], only_from=_HALTABLE,
                                            set_fields={"resumed": False})
        if done.changed:
            self._dispatcher.halt(done.doc)
            return done.doc
        current = done.doc or self._store.find(job_id) or doc
        state = JobState(current["state"])
        if state in (JobState.HALTING, JobState.HALTED):
            return current
        if state in (JobState.PENDING, JobState.QUEUED):
            why = "is waiting in the queue and has nothing to checkpoint; cancel it, or halt it once it runs"
        elif state == JobState.RESTARTING:
            why = "is restarting after a failure; halt it once it runs again"
        else:
            why = f"is already {state.name.lower()}; only a deploying or running job can be halted"
        raise Conflict(f"job {job_id!r} {why}")

    def resume(self, team: str, job_id: str, actor: str) -> dict:
        """HALTED -> QUEUED as the next attempt, restoring the checkpoint; repeating it is a no-op."""
        doc = self._store.get(team, job_id)
        who = actor or "user"
        state = JobState(doc["state"])
        if state != JobState.HALTED:
            if doc.get("resumed") and not states.is_terminal(state) and state != JobState.HALTING:
                return doc  # a retried resume
            raise Conflict(f"job {job_id!r} is {state.name.lower()}; only a halted job can be resumed")
        step = doc.get("checkpoint_step")
        where = f"from its checkpoint at step {step}" if step is not None else "from the start (no checkpoint)"
        done = self._store.apply_transition(
            job_id, JobState.QUEUED, f"resumed by {who}; continues {where}", who, attempt=doc["attempt"],
            only_from=[JobState.HALTED], set_fields=next_attempt(doc, resumed=True))
        if done.changed:
            self._dispatcher.wake()
            return done.doc
        return self.resume(team, job_id, actor)  # lost a race with another resume or a cancel: look again

    def report(self, job_id: str, attempt: int, state: JobState, reason: str, actor: str, *,
               learners: dict[str, dict] | None = None, outputs_uri: str = "",
               checkpoint_step: int | None = None) -> dict:
        """A state seen by the job monitor (or the LCM); stale, repeated and illegal ones change nothing.

        A failed attempt becomes RESTARTING while the manifest allows another
        restart, and HALTED when the job was halting (what was stored is kept).
        """
        if state == JobState.JOB_STATE_UNSPECIFIED:
            raise InvalidArgument("state is required", details=[{"field": "state", "message": "required"}])
        before = self._store.find(job_id)
        if before is None:
            raise NotFound(f"job {job_id!r} not found")
        if attempt and attempt != before["attempt"]:
            log.info("job %s: ignored %s for attempt %d; current attempt is %d", job_id, state.name, attempt,
                     before["attempt"])
            return before
        fields: dict = {}
        if learners:
            fields["learners"] = learners
        if outputs_uri:
            fields["outputs_uri"] = outputs_uri
        if checkpoint_step is not None:
            fields["checkpoint_step"] = checkpoint_step
        if state == JobState.FAILED:
            state, reason = self._after_failure(before, reason, fields)
        done = self._store.apply_transition(job_id, state, reason, actor or "monitor",
                                            attempt=before["attempt"], set_fields=fields)
        if done.changed:
            self._after_change(done.doc)
            return done.doc
        if done.doc is None:
            current = self._store.find(job_id) or before
            log.info("job %s: ignored report %s -> %s (%s): not a legal transition", job_id,
                     JobState(current["state"]).name, state.name, reason)
            return current
        # the same state again: only what the monitor saw of the learners may have moved on
        if fields and any(done.doc.get(k) != v for k, v in fields.items()):
            return self._store.set_fields(job_id, fields, state=state, attempt=before["attempt"]) or done.doc
        return done.doc

    @staticmethod
    def _after_failure(job: dict, reason: str, fields: dict) -> tuple[JobState, str]:
        """What a failed attempt means for the job: FAILED, RESTARTING (with backoff) or HALTED."""
        current = JobState(job["state"])
        if current == JobState.HALTING:
            return JobState.HALTED, f"halted, but not cleanly: {reason}; resume continues from the last stored checkpoint"
        policy = parse_manifest(job.get("manifest") or {}).restart
        done = int(job.get("restarts", 0))
        if current not in _HALTABLE or done >= policy.max_restarts:
            if policy.max_restarts:
                reason = f"{reason}\n(no restarts left: {done} of {policy.max_restarts} used)"
            return JobState.FAILED, reason
        delay = min(policy.backoff * 2 ** done, MAX_BACKOFF)
        fields.update(restarts=done + 1, restart_delay=delay)
        return JobState.RESTARTING, f"restart {done + 1} of {policy.max_restarts} in {delay:g}s after: {reason}"

    def _after_change(self, doc: dict) -> None:
        """After a transition: a job that let go of its resources frees room in the queue.

        Whatever left the ACTIVE states (terminal, HALTED, RESTARTING) is marked
        `cleanup_pending` by the store in the same update; the dispatcher
        removes its learners and, for RESTARTING, queues the next attempt.
        """
        if doc.get("cleanup_pending"):
            self._dispatcher.clean_up(doc["_id"])
        self._dispatcher.wake()

    def reconcile(self) -> None:
        """After a restart: finish admissions a crash interrupted and resend deployments it may have lost."""
        for doc in self._store.in_states([JobState.PENDING]):
            self._store.transition(doc["_id"], JobState.QUEUED, "admitted after a Trainer restart", ACTOR,
                                   only_from=[JobState.PENDING])
            log.info("job %s: admitted after restart", doc["_id"])
        for doc in self._store.in_states([JobState.DEPLOYING]):
            log.info("job %s: resending deploy of attempt %d after restart", doc["_id"], doc["attempt"])
            self._dispatcher.deploy(doc)
        for doc in self._store.in_states([JobState.HALTING]):
            log.info("job %s: resending the halt of attempt %d after restart", doc["_id"], doc["attempt"])
            self._dispatcher.halt(doc)
        # cleanups (and the requeue of RESTARTING jobs) are picked up by the dispatcher's passes
        self._dispatcher.wake()

    def health(self) -> str:
        self._store.ping()
        return "ok"

"""The job record in MongoDB, and the only place a job's state is written.

Every state change is one `find_one_and_update` whose filter names the state
the transition starts from, one of those services/common/states.py allows,
so two writers racing on a job cannot both win and the state and its history
entry change together. The status history is a sub-document keyed by a sortable, unique key rather than
an array: the embedded MongoDB-wire server (nx-27017) corrupts sub-documents
appended with `$push` (see services/common/adapters/mongo.py).

Documents hold states as JobState ints and times as unix seconds (floats).
This module is the only one that sees them: every read returns a typed
`JobRecord` (services/trainer/record.py) and every change is named by the
record's fields (services/trainer/storedocs.py converts), and every driver error
leaves it as a domain error (`mapped`, services/common/adapters/mongo.py).

Usage accounting rides on the same atomic updates: entering DEPLOYING
records `active_since`, and the one transition that takes a job out of the
ACTIVE states (to a terminal state, HALTED, or back to QUEUED for a restart)
adds `(now - active_since) * resources` (and, for an elastic job's grant,
`(now - grown_since) * grown`) to the job's `gpu_seconds` and
`cpu_seconds` in the same compare-and-set, so a stint is counted exactly once
even when reporters race or repeat themselves. Team totals are sums over the
team's jobs (`usage_rows`, services/trainer/store_reads.py).

Every write a dispatcher's pass decides on (insert, transition, cleanup done,
fields set) stamps `changed_at`, so the leader's copy of the queue
(services/trainer/jobmirror.py) reads only what changed (`changed_since`,
services/trainer/store_reads.py), and so does a client following many jobs
(`list(changed_after=)`). Exactly these writes stamp it: `insert`,
`apply_transition` (every state change, with its reason), `open_gate`,
`stamp_fence`, `grant`, `cleanup_done` and `set_fields`. `note_queued` (a
queued job's reason and position) and `note_event` (a history entry without
a state change) do not: they change nothing a pass decides on, and a
follower sees a job's transitions, not every update of its queue reason. The stamp is taken from `STAMPS` (services/trainer/
stamps.py), which knows which of this process's stamps are not acknowledged.

Idempotent submits: a job submitted with an idempotency key stores it, and a
unique index on (team, idempotency_key), partial to the jobs that have one,
lets exactly one of any number of concurrent inserts with the same key win;
the losers get the winner's job (`AlreadySubmitted`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from trainforge_services.common import states
from trainforge_services.common.adapters.mongo import (
    ASCENDING,
    DESCENDING,
    Database,
    DuplicateKeyError,
    ReturnDocument,
    ping,
)
from trainforge_services.common.errors import Conflict
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.states import JobState
from trainforge_services.trainer.fence import Deposed
from trainforge_services.trainer.record import GATE_CLOSED, GATE_OPEN, JobRecord
from trainforge_services.trainer.resources import Usage
from trainforge_services.trainer.stamps import STAMPS
from trainforge_services.trainer.store_reads import JobReads, mapped
from trainforge_services.trainer.storedocs import (
    grown_seconds,
    history_event,
    history_key,
    new_job_document,
    seconds_spent,
    to_document,
    to_record,
    usage_doc,
    usage_of,
)

log = logging.getLogger(__name__)

COLLECTION = "jobs"
# A job's state changes a handful of times in its life; more lost races than
# this in one call means something is looping.
_MAX_RACES = 16
# Updates per `update` command when noting the queue (far below MongoDB's write batch and message limits).
# Small: the embedded store runs one command at a time, so a command of 500 updates (~0.3-0.5 s on two
# loaded cores) held every read and reservation of the dispatcher behind it; between commands of 50 they
# get their turn.
_NOTE_BATCH = 50


class AlreadySubmitted(Exception):
    """An insert lost to an earlier job with the same (team, idempotency key); `job` is that job."""

    def __init__(self, job: JobRecord):
        super().__init__(job.id)
        self.job = job


class Transition(NamedTuple):
    job: JobRecord | None
    # True only for the one call that changed the state.
    changed: bool


class JobStore(JobReads):
    """The jobs collection's writes; its reads (by id or team, and the queries over every team's jobs) are
    `JobReads`'s (services/trainer/store_reads.py)."""

    def __init__(self, db: Database, collection: str = COLLECTION):
        super().__init__(db[collection])

    @mapped
    def ensure_indexes(self) -> None:
        self._jobs.create_index([("team", ASCENDING), ("created_at", DESCENDING)])
        self._jobs.create_index([("state", ASCENDING)])
        self._jobs.create_index([("experiment_id", ASCENDING)])
        self._jobs.create_index([("changed_at", ASCENDING)])
        # the dispatcher looks for pending cleanups every second and in each full read of its copy: without
        # an index the store scans every job ever run (1,000 of them: ~20 ms of its time, on an idle machine)
        self._jobs.create_index([("cleanup_pending", ASCENDING)])
        # partial: jobs without a key are not indexed, so any number of them may coexist
        self._jobs.create_index([("team", ASCENDING), ("idempotency_key", ASCENDING)], unique=True,
                                name="team_idempotency_key",
                                partialFilterExpression={"idempotency_key": {"$type": "string"}})

    def ping(self) -> None:
        """Unavailable when MongoDB cannot be reached."""
        ping(self._jobs.database)

    @mapped
    def insert(self, job_id: str, team: str, manifest: Manifest, *, code_uri: str = "",
               submitted_by: str = "", idempotency_key: str = "", experiment_id: str = "",
               trial: int = -1, admitted: str = "", gated: bool = False) -> JobRecord:
        """Persist a new PENDING job, or with `admitted` (the QUEUED reason) a job already admitted.

        Admitted, the job is inserted QUEUED with both history entries (submitted -> PENDING, PENDING ->
        QUEUED with that reason, in that order): the same record the insert and the admission's
        compare-and-set leave, in one write instead of three round trips (the compare-and-set read the
        job first). Nothing can have moved a job between its insert and its admission but a cancel, and a
        job is not known to anyone before its insert returns (its id is the caller's to hand out).

        AlreadySubmitted when the team already has a job with this
        idempotency key (whichever insert got there first); Conflict when the
        id is taken.
        """
        try:
            with STAMPS.taken() as now:
                doc = new_job_document(job_id, team, manifest, code_uri=code_uri, submitted_by=submitted_by,
                                       idempotency_key=idempotency_key, experiment_id=experiment_id, trial=trial,
                                       admitted=admitted, gated=gated, now=now)
                self._jobs.insert_one(doc)
        except DuplicateKeyError:
            # the unique index means "submitted before" for a key, "taken" for an id
            first = self.find_by_key(team, idempotency_key) if idempotency_key else None
            if first is not None:
                raise AlreadySubmitted(first) from None
            raise Conflict(f"job id {job_id!r} is already taken",
                           details=[{"field": "job_id", "message": "already taken"}]) from None
        return to_record(doc)  # type: ignore[return-value]

    @mapped
    def open_gate(self, job_id: str) -> JobRecord | None:
        """Open a gated job's gate (compare-and-set: "closed" -> "open"); the job after it, or None when its
        gate was not closed (opened before, or the job was never gated). Not a transition: the state stays."""
        with STAMPS.taken() as now:
            doc = self._jobs.find_one_and_update(
                {"_id": job_id, "gate": GATE_CLOSED},
                {"$set": {"gate": GATE_OPEN, "updated_at": now, "changed_at": now}},
                return_document=ReturnDocument.AFTER)
        return to_record(doc)

    def transition(self, job_id: str, to: JobState, reason: str, actor: str, *, attempt: int | None = None,
                   set_fields: Mapping | None = None,
                   only_from: Iterable[JobState] | None = None) -> JobRecord | None:
        """Move a job to `to` if that is legal from its current state; the job after it.

        Repeating a transition to the state the job is already in changes
        nothing and returns the job as it is. None when the job is missing,
        on another attempt, or in a state `to` cannot be entered from.
        """
        return self.apply_transition(job_id, to, reason, actor, attempt=attempt, set_fields=set_fields,
                                     only_from=only_from).job

    @mapped
    def apply_transition(self, job_id: str, to: JobState, reason: str, actor: str, *,
                         attempt: int | None = None, set_fields: Mapping | None = None,
                         only_from: Iterable[JobState] | None = None, fence: int | None = None,
                         seen: JobRecord | None = None, read: Mapping | None = None) -> Transition:
        """`transition`, also telling whether this call made the change (for callers that reserve).

        The write is a compare-and-set on the state just observed, which must
        be one of `allowed_from(to)`, so the history entry records its exact
        from-state in the same atomic update. A filter of `$in: allowed` would
        leave the from-state unknown (the embedded server has no pipeline
        updates to copy it) and could commit two racing writers in the
        opposite order of their history keys. Here a winner's key is made
        after it saw the previous winner's state, so history sorts in commit
        order. A lost race re-reads and tries again. `only_from` narrows the
        legal from-states (e.g. admit only a PENDING job, never resume a
        HALTED one). `set_fields` names record fields. With `fence` (a dispatcher
        leader's term, services/trainer/fence.py) the write also requires the
        job's fence stamp to be no newer and stamps it; a newer stamp raises
        `Deposed`.

        `seen`: the job as the caller last read it (the dispatcher's copy,
        services/trainer/jobmirror.py). When it is in a legal from-state
        outside ACTIVE (no usage to account), the first try writes on that
        state and fence stamp without reading: one round trip instead of
        two. If the job moved on or was stamped since, that compare-and-set
        matches nothing and the read-then-write loop below decides.

        `read`: the job's whole document, as the caller read it from the
        store just before (`find_document`). The first try writes on it: what
        the loop's own first read would have done, one round trip earlier (a
        monitor's report, which reads the job to decide, saves one of three).
        A document that no longer holds goes the same way as a stale `seen`.
        """
        allowed = states.allowed_from(to)
        if only_from is not None:
            allowed = allowed & frozenset(only_from)
        match: dict = {"_id": job_id}
        if attempt is not None:
            match["attempt"] = attempt
        if seen is not None and seen.state in allowed and seen.state not in states.ACTIVE \
                and (fence is None or seen.fence <= fence):
            assumed = {"state": int(seen.state), **({"fence": seen.fence} if seen.fence else {})}
            doc = self._write(match, assumed, to, reason, actor, set_fields, fence)
            if doc is not None:
                return Transition(to_record(doc), True)
        elif read is not None and all(read.get(k) == v for k, v in match.items()) \
                and JobState(read["state"]) in allowed and JobState(read["state"]) != to:
            doc = self._write(match, read, to, reason, actor, set_fields, fence)
            if doc is not None:
                return Transition(to_record(doc), True)
        for _ in range(_MAX_RACES):
            current = self._jobs.find_one(match)
            if current is None:
                return Transition(None, False)
            frm = JobState(current["state"])
            if frm == to:
                return Transition(to_record(current), False)
            if frm not in allowed:
                return Transition(None, False)
            doc = self._write(match, current, to, reason, actor, set_fields, fence)
            if doc is not None:
                return Transition(to_record(doc), True)
        log.warning("job %s: gave up moving to %s after %d lost races", job_id, to.name, _MAX_RACES)
        return Transition(None, False)

    def _write(self, match: dict, current: Mapping, to: JobState, reason: str, actor: str,
               set_fields: Mapping | None, fence: int | None) -> Mapping | None:
        """One compare-and-set of `to` on the state (and fence stamp) `current` holds; the job after it, or None
        when it no longer holds them."""
        with STAMPS.taken() as now:
            return self._write_at(now, match, current, to, reason, actor, set_fields, fence)

    def _write_at(self, now: float, match: dict, current: Mapping, to: JobState, reason: str, actor: str,
                  set_fields: Mapping | None, fence: int | None) -> Mapping | None:
        frm = JobState(current["state"])
        update = {**to_document(set_fields or {}), "state": int(to), "reason": reason, "updated_at": now,
                  "changed_at": now,
                  f"history.{history_key()}": history_event(frm, to, reason, actor, now,
                                                            (set_fields or {}).get("borrowed"))}
        if to != JobState.QUEUED:
            update["queue_position"] = 0
        if to == JobState.DEPLOYING:
            # a new attempt starts at its minimum: growth is granted again (services/trainer/growth.py)
            update.update(active_since=now, grown=usage_doc(Usage()), grown_since=None)
        if frm in states.ACTIVE and frm != JobState.RESTARTING and \
                (to not in states.ACTIVE or to == JobState.RESTARTING):
            # learners may still run: the dispatcher removes them (RESTARTING: then queues the
            # next attempt) and clears this. Leaving RESTARTING leaves it as it is: it was set on
            # the way in, and only the dispatcher clears it, after KillJob.
            update["cleanup_pending"] = True
        changes: dict = {"$set": update}
        if spent := seconds_spent(current, frm, to, now):
            changes["$inc"] = spent
            update["grown_since"] = None  # the grant's seconds are in `spent`
        guard: dict = {**match, "state": int(frm)}
        if fence is not None:
            if int(current.get("fence", 0)) > fence:
                raise Deposed(f"job {match['_id']}: term {fence} is older than the job's fence "
                              f"{current['fence']}; a newer dispatcher leads")
            # the stamp just read, compared for equality: nx-27017 applies an `$or` beside `_id` to
            # other documents
            guard["fence"] = current["fence"] if "fence" in current else {"$exists": False}
            update["fence"] = fence
        return self._jobs.find_one_and_update(guard, changes, return_document=ReturnDocument.AFTER)

    @mapped
    def stamp_fence(self, term: int) -> int:
        """Stamp every QUEUED job, and every ACTIVE elastic one (a grant is fenced too), with a new dispatcher
        leader's term (services/trainer/fence.py); how many."""
        which = [{"state": int(JobState.QUEUED)}] + [{"state": int(s), "max_learners": {"$gt": 0}}
                                                     for s in sorted(states.ACTIVE)]
        with STAMPS.taken() as now:
            stamp = {"$set": {"fence": term, "changed_at": now}}  # the leader's copy rereads them
            return sum(self._jobs.update_many({**w, "fence": older}, stamp).modified_count
                       for w in which for older in ({"$exists": False}, {"$lt": term}))

    @mapped
    def grant(self, job_id: str, attempt: int, was: Usage, grown: Usage, *, fence: int | None = None,
              reason: str = "", actor: str = "trainer") -> bool:
        """Raise a RUNNING elastic attempt's grant from `was` to `grown` (compare-and-set on both); the
        seconds of the grant so far are added to its totals, and the new grant counts from now. A history
        entry (RUNNING to RUNNING, with `grown`) records the grant's time and size in the same write, so
        per-day usage (services/api/usage.py) integrates what the job held. With `fence` (the dispatcher
        leader's term, services/trainer/fence.py) the write also requires the job's fence stamp to be the one
        read and no newer, and stamps it; a newer stamp raises `Deposed`."""
        with STAMPS.taken() as now:
            return self._grant_at(now, job_id, attempt, was, grown, fence, reason, actor)

    def _grant_at(self, now: float, job_id: str, attempt: int, was: Usage, grown: Usage, fence: int | None,
                  reason: str, actor: str) -> bool:
        match = {"_id": job_id, "attempt": attempt, "state": int(JobState.RUNNING)}
        current = self._jobs.find_one(match, {"grown": 1, "grown_since": 1, "fence": 1})
        if current is None or usage_of(current.get("grown")) != was:
            return False
        guard = {**match, "grown_since": current.get("grown_since")}
        update = {"grown": usage_doc(grown), "grown_since": now, "updated_at": now, "changed_at": now,
                  f"history.{history_key()}": history_event(
                      JobState.RUNNING, JobState.RUNNING,
                      reason or f"granted {grown.learners} learner(s) beyond the minimum", actor, now, grown=grown)}
        if fence is not None:
            if int(current.get("fence", 0)) > fence:
                raise Deposed(f"job {job_id}: term {fence} is older than the job's fence {current['fence']}; "
                              "a newer dispatcher leads")
            guard["fence"] = current["fence"] if "fence" in current else {"$exists": False}
            update["fence"] = fence
        changes: dict = {"$set": update}
        if spent := grown_seconds(current, now):
            changes["$inc"] = spent
        return self._jobs.update_one(guard, changes).modified_count == 1

    @mapped
    def cleanup_done(self, job_id: str, attempt: int) -> None:
        """The learners of `attempt` (and any earlier one) are gone."""
        with STAMPS.taken() as now:
            self._jobs.update_one({"_id": job_id, "attempt": attempt},
                                  {"$set": {"cleanup_pending": False, "changed_at": now}})

    @mapped
    def set_fields(self, job_id: str, fields: Mapping[str, Any], *, state: JobState,
                   attempt: int | None = None) -> JobRecord | None:
        """Update non-state fields (queue reason, learners) only while the job is still in `state`."""
        match: dict = {"_id": job_id, "state": int(state)}
        if attempt is not None:
            match["attempt"] = attempt
        with STAMPS.taken() as now:
            return to_record(self._jobs.find_one_and_update(
                match, {"$set": {**to_document(fields), "updated_at": now, "changed_at": now}},
                return_document=ReturnDocument.AFTER))

    @mapped
    def note_event(self, job_id: str, attempt: int, state: JobState, reason: str, actor: str) -> bool:
        """Add a history entry that is not a transition (from and to `state`), only while the job is in it."""
        now = time.time()
        done = self._jobs.update_one({"_id": job_id, "attempt": attempt, "state": int(state)},
                                     {"$set": {f"history.{history_key()}": history_event(state, state, reason, actor, now),
                                               "updated_at": now}})
        return done.modified_count == 1

    @mapped
    def note_queued(self, notes: Iterable[tuple[str, int, str, int]]) -> None:
        """(job, attempt, reason, position) of waiting jobs, each written only while the job still waits.

        One `update` command per batch rather than a round trip per job: a
        pass rewrites most of the queue's reasons, and a job the pass saw may
        have been cancelled since, which the filter leaves alone.
        """
        now = time.time()
        updates = [{"q": {"_id": job_id, "state": int(JobState.QUEUED), "attempt": attempt},
                    "u": {"$set": {"reason": reason, "queue_position": position, "updated_at": now}}}
                   for job_id, attempt, reason, position in notes]
        for i in range(0, len(updates), _NOTE_BATCH):
            reply = self._jobs.database.command("update", self._jobs.name, updates=updates[i:i + _NOTE_BATCH],
                                                ordered=False)
            if reply.get("writeErrors"):
                log.warning("queue notes not stored: %s", reply["writeErrors"][:3])

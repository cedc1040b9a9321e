"""The job store's reads: a job by id, key or team (`find`, `get`, `list`, ...), and the read-only queries over
every team's jobs that the dispatcher's copy of the queue (services/trainer/jobmirror.py), the dispatcher's
cleanups, the experiment driver and accounting make.

`JobStore` (services/trainer/store.py) inherits them; they live apart because none of them writes, and the
store's writes (insert, transitions, grants, fences, cleanups done, fields set, notes) are what that module
is about. The indexes these queries rely on are created in one place, `JobStore.ensure_indexes`. Like the
rest of the store, every query returns typed `JobRecord`s (services/trainer/storedocs.py converts) and
leaves driver errors as domain errors (`mapped`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from trainforge_services.common.adapters.mongo import ASCENDING, DESCENDING, Collection, mapped_as
from trainforge_services.common.errors import NotFound
from trainforge_services.common.states import JobState
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.storedocs import fields_projection, to_record, to_records

# What a client reads when MongoDB fails under the job store ("job store unavailable; retry shortly").
mapped = mapped_as("job store")


class JobReads:
    """Queries on the jobs collection; `JobStore` adds the writes."""

    def __init__(self, jobs: Collection):
        self._jobs = jobs

    @mapped
    def find_by_key(self, team: str, idempotency_key: str) -> JobRecord | None:
        """The team's job submitted with this idempotency key, if any."""
        return to_record(self._jobs.find_one({"team": team, "idempotency_key": idempotency_key}))

    @mapped
    def find(self, job_id: str) -> JobRecord | None:
        """Any team's job; for callers that are the platform itself (monitor, LCM, dispatcher)."""
        return to_record(self._jobs.find_one({"_id": job_id}))

    @mapped
    def find_document(self, job_id: str) -> tuple[JobRecord, Mapping] | None:
        """`find`, with the document as read: a caller that decides on the job and then moves it hands the
        document to `apply_transition(read=)`, which then writes on it instead of reading it again."""
        doc = self._jobs.find_one({"_id": job_id})
        return None if doc is None else (to_record(doc), doc)

    @mapped
    def get(self, team: str, job_id: str) -> JobRecord:
        """One of a team's jobs. Another team's job is NotFound, exactly like a missing one."""
        job = to_record(self._jobs.find_one({"_id": job_id, "team": team}))
        if job is None:
            raise NotFound(f"job {job_id!r} not found")
        return job

    @mapped
    def list(self, team: str, *, states_filter: Iterable[JobState] = (), limit: int = 100, name: str = "",
             created_after: float = 0.0, created_before: float = 0.0,
             before: tuple[float, str] | None = None, changed_after: float = 0.0) -> list[JobRecord]:
        """A team's jobs, newest first (then by id, descending); `before` is the last (created_at, id) seen.

        `changed_after`: only jobs whose `changed_at` is at or after it (0: no bound). At or after, not
        after: the time a follower passes is a listing's `as_of` (services/trainer/job_service.py `list`), and
        a write stamped exactly then may still have been out when that listing read; such a job is returned
        twice rather than missed. A change that stamps nothing (a queue note) does not bring a job back."""
        query: dict = {"team": team}
        if changed_after:
            query["changed_at"] = {"$gte": changed_after}
        wanted = [int(s) for s in states_filter]
        if wanted:
            query["state"] = {"$in": wanted}
        if name:
            query["name"] = name
        created: dict = {}
        if created_after:
            created["$gte"] = created_after
        if created_before:
            created["$lt"] = created_before
        if created:
            query["created_at"] = created
        if before is not None:
            query["$or"] = [{"created_at": {"$lt": before[0]}}, {"created_at": before[0], "_id": {"$lt": before[1]}}]
        cursor = self._jobs.find(query).sort([("created_at", DESCENDING), ("_id", DESCENDING)])
        return to_records(cursor.limit(limit))

    @mapped
    def of_experiment(self, experiment_id: str, states: Iterable[JobState] | None = None) -> list[JobRecord]:
        """An experiment's trials (without history and learners), in trial order; only those in `states` if given."""
        query: dict[str, Any] = {"experiment_id": experiment_id}
        if states is not None:
            query["state"] = {"$in": [int(s) for s in states]}
        cursor = self._jobs.find(query, {"history": 0, "learners": 0})
        return sorted(to_records(cursor), key=lambda j: (j.trial, j.created_at))

    @mapped
    def in_states(self, wanted: Iterable[JobState], fields: Iterable[str] | None = None) -> list[JobRecord]:
        """Every team's jobs in these states: only `fields` (and the id, state), or all but history and learners."""
        query = {"state": {"$in": [int(s) for s in wanted]}}
        projection = fields_projection([*fields, "state"]) if fields is not None else {"history": 0, "learners": 0}
        return to_records(self._jobs.find(query, projection))

    @mapped
    def live_page(self, wanted: Iterable[JobState], since: float, limit: int, fields: Iterable[str]) -> list[JobRecord]:
        """One page of the jobs in `wanted`, in `changed_at` order from `since` (inclusive), at most `limit`:
        only `fields` (and the id, state, `changed_at`). The store serves it from the
        `changed_at` index, so a page costs about its own jobs: a read of every queued and active job in
        such pages holds the store (one command at a time) for a page at a time, not for the whole set
        (services/trainer/jobmirror.py). `limit` 0: every such job from `since` on."""
        query = {"state": {"$in": [int(s) for s in wanted]}, "changed_at": {"$gte": since}}
        cursor = self._jobs.find(query, fields_projection([*fields, "state", "changed_at"]))
        cursor = cursor.sort("changed_at", ASCENDING)
        return to_records(cursor.limit(limit) if limit else cursor)

    @mapped
    def changed_since(self, since: float, fields: Iterable[str]) -> list[JobRecord]:
        """Every job whose `changed_at` (insert, transition, cleanup, fields set) is at or after `since`, in any
        state: only `fields` (and the id, state). Queue notes and history notes do not stamp it."""
        return to_records(self._jobs.find({"changed_at": {"$gte": since}}, fields_projection([*fields, "state"])))

    @mapped
    def usage_rows(self, team: str | None = None) -> list[JobRecord]:
        """What accounting needs of every job (of one team): team, state, resources, times, seconds used."""
        query = {} if team is None else {"team": team}
        fields = ("team", "state", "resources", "gpu_type", "active_since", "gpu_seconds", "cpu_seconds", "borrowed",
                  "grown", "grown_since")
        return to_records(self._jobs.find(query, fields_projection(fields)))

    @mapped
    def pending_cleanups(self, fields: Iterable[str] = ("attempt",)) -> list[JobRecord]:
        """Jobs that left the ACTIVE states and whose learners may not be removed yet (id, state, `fields`)."""
        return to_records(self._jobs.find({"cleanup_pending": True}, fields_projection([*fields, "state"])))


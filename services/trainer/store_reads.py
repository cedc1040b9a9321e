"""The job store's read-only queries over every team's jobs: what the dispatcher's copy of the queue
(services/trainer/jobmirror.py), the dispatcher's cleanups, the experiment driver and accounting read.

`JobStore` (services/trainer/store.py) inherits them; they live apart because none of them writes, and the
store's writes (insert, transitions, grants, fences, cleanups done, fields set, notes) are what that module
is about. The indexes these queries rely on are created in one place, `JobStore.ensure_indexes`. Like the
rest of the store, every query returns typed `JobRecord`s (services/trainer/storedocs.py converts) and
leaves driver errors as domain errors (`mapped`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trainforge_services.common.adapters.mongo import ASCENDING, Collection, mapped_as
from trainforge_services.common.states import JobState
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.storedocs import fields_projection, to_records

# What a client reads when MongoDB fails under the job store ("job store unavailable; retry shortly").
mapped = mapped_as("job store")


class JobReads:
    """Queries on `_jobs`, the jobs collection (set by `JobStore`)."""

    _jobs: Collection

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


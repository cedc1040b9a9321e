"""Team quotas in MongoDB: one document per team, replaced whole by SetQuota.

A quota is read by every dispatch pass and at submit, and written rarely (by
an admin), so it lives in its own small collection keyed by team rather than
on the jobs. SetQuota replaces the whole document: a limit left out of the
request is removed (no limit of the team's own), so what an admin sends is
exactly what applies. Validation lives here, next to the one writer, and
names each field as the wire does (`quota.gpus`, `quota.gpus_by_type.a100`).
MongoDB's errors leave it as domain errors (`mapped`).

The Trainer reads the whole collection at most once per `max_age` (0.5 s;
`QUOTA_MAX_AGE`) and answers `get` and `all` from that copy: a pass, each
submit's size check and each deploy (which sends the team's quota) read it,
and in a burst those were a store round trip each. A quota set through this
process replaces the copy at once; one set through another replica is seen
within `max_age` (the copy's time is taken before the read). `max_age=0`
reads the store on every call.
"""

from __future__ import annotations

import math
import re
import threading
import time

from trainforge_services.common import egress
from trainforge_services.common.adapters.mongo import Database, mapped_as
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.trainer.resources import Quota
from trainforge_services.trainer.storedocs import quota_doc, quota_of

COLLECTION = "quotas"
mapped = mapped_as("quota store")
# The rule of the manifest's resources.gpu_type, which a type quota must be able to match.
_GPU_TYPE = re.compile(r"^[a-z0-9-]{1,32}$")
_COHORT = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_BORROWABLE = ("gpus", "cpus", "memory")
# Quota.gpus and the per-type limits are int32 on the wire, memory int64.
_MAX_INT32 = 2**31 - 1
_MAX_INT64 = 2**63 - 1


def validate(team: str, quota: Quota) -> None:
    """InvalidArgument listing every bad field of a quota about to be set."""
    problems = []
    if not team:
        problems.append(("team", "required"))
    for name, limit, most in (("gpus", quota.gpus, _MAX_INT32), ("cpus", quota.cpus, None),
                              ("memory", quota.memory, _MAX_INT64), ("jobs", quota.jobs, _MAX_INT32)):
        if limit is None:
            continue
        if not math.isfinite(limit) or limit < 0:
            problems.append((f"quota.{name}", "must be a number >= 0 (leave it unset for no limit)"))
        elif most is not None and limit > most:
            problems.append((f"quota.{name}", f"must be at most {most}"))
    for gpu_type, limit in quota.gpus_by_type.items():
        if not _GPU_TYPE.match(gpu_type):
            problems.append((f"quota.gpus_by_type.{gpu_type}", "GPU type must be 1-32 lowercase letters, "
                                                              "digits or '-'"))
        elif limit < 0:
            problems.append((f"quota.gpus_by_type.{gpu_type}", "must be >= 0"))
    problems += _cohort_problems(quota)
    if quota.egress is not None:
        try:
            egress.parse(quota.egress)
        except ValueError as e:
            problems.append(("quota.egress", str(e)))
    if problems:
        raise InvalidArgument("invalid quota: " + "; ".join(f"{f}: {m}" for f, m in problems),
                              details=[{"field": f, "message": m} for f, m in problems])


def _cohort_problems(quota: Quota) -> list[tuple[str, str]]:
    """The cohort's name and the lending and borrowing limits (services/trainer/cohorts.py)."""
    problems = []
    if quota.cohort and not _COHORT.match(quota.cohort):
        problems.append(("quota.cohort", "must be 1-63 lowercase letters, digits or '-', starting and ending "
                                         "with a letter or digit"))
    for kind, limits in (("lending_limit", quota.lending_limit), ("borrowing_limit", quota.borrowing_limit)):
        for name in _BORROWABLE:
            limit, nominal, where = getattr(limits, name), getattr(quota, name), f"quota.{kind}.{name}"
            if limit is None:
                continue
            if not quota.cohort:
                problems.append((where, "only applies in a cohort: set quota.cohort"))
            elif not math.isfinite(limit) or limit < 0:
                problems.append((where, "must be a number >= 0 (leave it unset for no limit)"))
            elif nominal is None:
                problems.append((where, f"needs quota.{name}: a team lends and borrows only what it has a "
                                        "limit for"))
            elif kind == "lending_limit" and limit > nominal:
                problems.append((where, f"must be at most quota.{name} ({nominal:g})"))
    return problems


QUOTA_MAX_AGE = 0.5


class QuotaStore:
    def __init__(self, db: Database, collection: str = COLLECTION, *, max_age: float = 0.0):
        self._quotas = db[collection]
        self._max_age = max_age
        self._copy: dict[str, Quota] | None = None
        self._copy_at = float("-inf")  # time.monotonic() taken before the read that made the copy
        self._put_at = float("-inf")  # when this process's last put returned: older reads may miss it
        self._lock = threading.Lock()

    def get(self, team: str) -> Quota:
        """A team's quota; a team nobody set one for has no limits of its own."""
        if self._max_age > 0:
            return self.all().get(team, Quota())
        return self._get(team)

    @mapped
    def _get(self, team: str) -> Quota:
        doc = self._quotas.find_one({"_id": team})
        return quota_of(doc["quota"]) if doc else Quota()

    def all(self, max_age: float | None = None) -> dict[str, Quota]:
        """Every team that has a quota document; `max_age`: read them again once the copy is that old (at
        most the store's own `max_age`: a reader that keeps the copy fresh ahead of those who use it)."""
        if self._max_age <= 0:
            return self._all()
        age = self._max_age if max_age is None else min(max_age, self._max_age)
        with self._lock:
            if self._copy is not None and time.monotonic() - self._copy_at < age:
                return dict(self._copy)
        at = time.monotonic()
        quotas = self._all()
        with self._lock:
            if at >= self._copy_at and at > self._put_at:  # not older than the copy, nor than a put of ours
                self._copy, self._copy_at = quotas, at
        return dict(quotas)

    @mapped
    def _all(self) -> dict[str, Quota]:
        return {doc["_id"]: quota_of(doc["quota"]) for doc in self._quotas.find({})}

    @mapped
    def put(self, team: str, quota: Quota, actor: str) -> Quota:
        """Replace a team's quota (validated); the quota as stored."""
        validate(team, quota)
        doc = {"_id": team, "quota": quota_doc(quota), "updated_at": time.time(), "updated_by": actor}
        self._quotas.replace_one({"_id": team}, doc, upsert=True)
        with self._lock:  # the next read sees it; a read begun before now does not become the copy
            self._copy, self._copy_at, self._put_at = None, float("-inf"), time.monotonic()
        return self._get(team)

"""An in-memory twin of the Trainer, for running the API without the rest of the platform.

Tests of the API, the SDK and the CLI use it; it lives under tests/ so no
test twin ships in the production package. It keeps the parts of the
Trainer's contract the API relies on: team scoping (another team's job is
NOT_FOUND), newest-first listing, state filters, legal transitions from
trainforge_services.common.states, a status history, and team quotas with usage (what
the team's active jobs hold, its queue). It does not admit, queue or run
anything, and it does not enforce quotas; `report()` moves a job the way
the job monitor's ReportJobStatus would.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterable

from trainforge_services.api.trainer_client import job_state_name
from trainforge_services.common import states
from trainforge_services.common.errors import Conflict, InvalidArgument, NotFound
from trainforge_services.common.states import JobState
from trainforge_services.common.storeaccess import Publication, publication_prefix, publication_teams

# States in which a job holds its resources (protos/trainer.proto, Quota.jobs).
_HOLDING = frozenset({"deploying", "running", "storing", "halting", "restarting"})


class InMemoryTrainer:
    def __init__(self) -> None:
        self._jobs: dict[str, dict] = {}
        self._lock = threading.Lock()
        self.submissions: list[dict] = []  # every SubmitJob request as received
        self._quotas: dict[str, dict] = {}
        self.quota_requests: list[dict] = []  # every SetQuota request as received
        # what the backend runs at once ({gpus, cpus, memory, learners}); None: the LCM has not said
        self.capacity: dict | None = None
        self._published: dict[str, Publication] = {}

    def close(self) -> None:
        pass

    def health(self) -> str:
        return "ok"

    def set_publication(self, prefix: str, teams: list[str], *, actor: str) -> dict:
        """The Trainer's rule (services/trainer/storerefs.py's Publications), kept in memory."""
        key = publication_prefix(prefix)
        with self._lock:
            if not teams:
                if self._published.pop(key, None) is None:
                    raise NotFound(f"{prefix} is not published")
                return {"prefix": prefix, "teams": []}
            pub = self._published[key] = Publication(key, publication_teams(teams))
        return {"prefix": pub.uri, "teams": sorted(pub.teams)}

    def publications(self) -> list[dict]:
        with self._lock:
            return [{"prefix": p.uri, "teams": sorted(p.teams)} for _, p in sorted(self._published.items())]

    def submit_job(self, *, team: str, manifest_json: str, code_uri: str, submitted_by: str,
                   job_id: str) -> dict:
        if not job_id:
            raise InvalidArgument("job_id is required by this twin")
        manifest = json.loads(manifest_json)
        now = time.time()
        with self._lock:
            if job_id in self._jobs:
                raise Conflict(f"job {job_id} already exists")
            self.submissions.append({"team": team, "manifest_json": manifest_json, "code_uri": code_uri,
                                     "submitted_by": submitted_by, "job_id": job_id})
            job = {"id": job_id, "team": team, "name": manifest.get("name", ""), "state": "pending",
                   "reason": "", "queue_position": 0, "attempt": 0, "created_at": now, "updated_at": now,
                   "learners": [], "history": [], "manifest": manifest, "outputs_uri": "",
                   "submitted_by": submitted_by, "code_uri": code_uri}
            self._jobs[job_id] = job
            self._move(job, JobState.PENDING, "submitted", f"user:{submitted_by}")
            self._move(job, JobState.QUEUED, "waiting for capacity", "trainer")
            job["queue_position"] = 1 + sum(1 for j in self._jobs.values()
                                             if j["team"] == team and j["state"] == "queued" and j is not job)
            return self._public(job)

    def get_job(self, team: str, job_id: str) -> dict:
        with self._lock:
            return self._public(self._find(team, job_id))

    def list_jobs(self, team: str, *, limit: int = 50, states: Iterable[JobState] = (), name: str = "",
                  created_after: float = 0.0, created_before: float = 0.0,
                  before: tuple[float, str] | None = None) -> list[dict]:
        return self.list_jobs_as_of(team, limit=limit, states=states, name=name, created_after=created_after,
                                    created_before=created_before, before=before)[0]

    def list_jobs_as_of(self, team: str, *, changed_after: float = 0.0, limit: int = 50,
                        states: Iterable[JobState] = (), name: str = "", created_after: float = 0.0,
                        created_before: float = 0.0,
                        before: tuple[float, str] | None = None) -> tuple[list[dict], float]:
        """A job's `updated_at` stands for the Trainer's `changed_at` here: only moves set it. Under the lock
        no write is out, so `as_of` is simply the time before the read."""
        wanted = {job_state_name(s) for s in states}
        with self._lock:
            as_of = time.time()
            jobs = [j for j in self._jobs.values() if j["team"] == team and (not wanted or j["state"] in wanted)
                    and j["updated_at"] >= changed_after
                    and (not name or j["name"] == name) and j["created_at"] >= created_after
                    and (not created_before or j["created_at"] < created_before)
                    and (before is None or (j["created_at"], j["id"]) < before)]
            jobs.sort(key=lambda j: (j["created_at"], j["id"]), reverse=True)
            return [self._public(j) for j in jobs[:limit or None]], as_of

    def cancel_job(self, team: str, job_id: str, *, actor: str) -> dict:
        with self._lock:
            job = self._find(team, job_id)
            current = JobState[job["state"].upper()]
            if current != JobState.CANCELLED:
                if not states.can_transition(current, JobState.CANCELLED):
                    raise Conflict(f"job {job_id} is {job['state']} and cannot be cancelled")
                self._move(job, JobState.CANCELLED, "cancelled by user", actor)
            return self._public(job)

    def halt_job(self, team: str, job_id: str, *, actor: str) -> dict:
        """A queued or running twin job halts at once: there are no learners to wait for."""
        with self._lock:
            job = self._find(team, job_id)
            current = JobState[job["state"].upper()]
            if current not in (JobState.HALTING, JobState.HALTED):
                if not states.can_transition(current, JobState.HALTING):
                    raise Conflict(f"job {job_id} is {job['state']} and cannot be halted")
                self._move(job, JobState.HALTING, f"halt requested by {actor}", actor)
                self._move(job, JobState.HALTED, "halted", "monitor")
            return self._public(job)

    def resume_job(self, team: str, job_id: str, *, actor: str) -> dict:
        with self._lock:
            job = self._find(team, job_id)
            if job["state"] != "halted":
                raise Conflict(f"job {job_id} is {job['state']}; only a halted job can be resumed")
            job["attempt"] += 1
            self._move(job, JobState.QUEUED, f"resumed by {actor}", actor)
            return self._public(job)

    def set_quota(self, team: str, quota: dict, *, actor: str) -> dict:
        """Replace the team's quota whole, as the Trainer does: a limit left out is no limit."""
        if not team:
            raise InvalidArgument("team is required", details=[{"field": "team", "message": "required"}])
        clean = {name: quota.get(name) for name in ("gpus", "cpus", "memory", "jobs")}
        clean["gpus_by_type"] = dict(sorted((quota.get("gpus_by_type") or {}).items()))
        clean["cohort"] = quota.get("cohort") or ""
        for kind in ("lending_limit", "borrowing_limit"):
            given = {k: v for k, v in (quota.get(kind) or {}).items() if v is not None}
            clean[kind] = {k: given.get(k) for k in ("gpus", "cpus", "memory")} if given else None
        clean["egress"] = quota.get("egress")
        with self._lock:
            self.quota_requests.append({"team": team, "quota": copy.deepcopy(clean), "actor": actor})
            self._quotas[team] = clean
            return self._usage(team)

    def team_usage(self, team: str) -> dict:
        if not team:
            raise InvalidArgument("team is required", details=[{"field": "team", "message": "required"}])
        with self._lock:
            return self._usage(team)

    def list_usage(self) -> list[dict]:
        with self._lock:
            teams = set(self._quotas) | {j["team"] for j in self._jobs.values()}
            return [self._usage(t) for t in sorted(teams)]

    def cluster(self) -> dict:
        with self._lock:
            reports = [self._usage(t) for t in sorted(set(self._quotas) | {j["team"] for j in self._jobs.values()})]
            learners = sum(int(j["manifest"].get("learners") or 1) for j in self._jobs.values()
                           if j["state"] in _HOLDING)
        held = {"gpus": sum(r["in_use"]["gpus"] for r in reports), "cpus": sum(r["in_use"]["cpus"] for r in reports),
                "memory": sum(r["in_use"]["memory"] for r in reports), "learners": learners}
        cap = copy.deepcopy(self.capacity)
        return {"backend": "memory" if cap else "", "known": cap is not None,
                "unknown_reason": "" if cap else "the LCM has not reported its capacity yet", "capacity": cap,
                "held": held, "free": {k: max(0, cap[k] - held[k]) for k in cap} if cap else None,
                "active_jobs": sum(r["active_jobs"] for r in reports),
                "queued_jobs": sum(r["queued_jobs"] for r in reports)}

    def _usage(self, team: str) -> dict:
        quota = copy.deepcopy(self._quotas.get(team) or {"gpus": None, "cpus": None, "memory": None, "jobs": None,
                                                          "gpus_by_type": {}})
        held = {"gpus": 0, "cpus": 0.0, "memory": 0, "jobs": 0, "gpus_by_type": {}}
        queued = 0
        for job in self._jobs.values():
            if job["team"] != team:
                continue
            if job["state"] == "queued":
                queued += 1
            if job["state"] not in _HOLDING:
                continue
            res = job["manifest"].get("resources") or {}
            learners = int(job["manifest"].get("learners") or 1)
            gpus = int(res.get("gpus") or 0) * learners
            held["jobs"] += 1
            held["gpus"] += gpus
            held["cpus"] += float(res.get("cpus") or 0) * learners
            held["memory"] += int(res.get("memory") or 0) * learners
            if res.get("gpu_type") and gpus:
                held["gpus_by_type"][res["gpu_type"]] = held["gpus_by_type"].get(res["gpu_type"], 0) + gpus
        return {"team": team, "quota": quota, "in_use": held, "queued_jobs": queued, "active_jobs": held["jobs"],
                "gpu_seconds": 0.0, "cpu_seconds": 0.0}

    def report(self, job_id: str, state: JobState, reason: str = "", *, actor: str = "monitor",
               learners: list[dict] | None = None, outputs_uri: str = "") -> dict:
        """Move a job along a legal transition, as the job monitor would."""
        with self._lock:
            job = self._jobs[job_id]
            current = JobState[job["state"].upper()]
            if current != state:
                if not states.can_transition(current, state):
                    raise Conflict(f"{job['state']} -> {job_state_name(state)} is not a legal transition")
                self._move(job, state, reason, actor)
            elif state == JobState.DEPLOYING and reason:  # the learners' preparing progress, as the Trainer keeps it
                job["reason"] = reason
            if learners is not None:
                job["learners"] = copy.deepcopy(learners)
            if outputs_uri:
                job["outputs_uri"] = outputs_uri
            return self._public(job)

    def _find(self, team: str, job_id: str) -> dict:
        job = self._jobs.get(job_id)
        if job is None or job["team"] != team:
            raise NotFound(f"job {job_id} not found")
        return job

    @staticmethod
    def _move(job: dict, to: JobState, reason: str, actor: str) -> None:
        now = time.time()
        frm = "unspecified" if not job["history"] else job["state"]
        job["history"].append({"from": frm, "to": job_state_name(to), "reason": reason, "actor": actor,
                               "timestamp": now})
        job["state"] = job_state_name(to)
        job["reason"] = reason
        job["updated_at"] = now
        if to != JobState.QUEUED:
            job["queue_position"] = 0
        if to == JobState.DEPLOYING:
            job["attempt"] += 1

    @staticmethod
    def _public(job: dict) -> dict:
        out = copy.deepcopy(job)
        out.pop("code_uri", None)
        return out

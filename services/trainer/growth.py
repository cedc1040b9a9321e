"""Growing elastic jobs where admission sees it: the Trainer grants learners, the LCM starts them.

An elastic job (`learners: {min, max}`) is admitted and deployed at its
minimum. It grows only as far as the Trainer grants it (the LCM's GrowJob;
services/lcm/lifecycle/elastic.py fills open slots up to the grant), and the
admission pass makes grants (`Grower.run`) only

- into room its own arithmetic finds: the backend's capacity less what every
  ACTIVE job holds (`resources`, the minimum, plus `grown`, what was granted
  beyond it) and the team's own quota (growth does not borrow in a cohort);
- when no queued job waits for that room: a job waiting for capacity stops
  all growth, one waiting only for its team's quota stops its own team's,
  and a job held back (restart backoff, cleanup) stops all growth too, as it
  will want room soon. With an empty queue, jobs grow up to their max.

A grant is written to the job first (`JobStore.grant`, a compare-and-set on
the attempt, state RUNNING, the previous grant and the leader's fence stamp,
with a history entry of its time and size), so the next pass counts
it, and then sent to the LCM, again each pass until the LCM acknowledged it
(so a lost call or an LCM failover loses no grant). Oldest running job first.
A grown job keeps its learners until its attempt ends; its next attempt
(a resume, a restart) starts at the minimum again (dispatch clears `grown`).
Accounting charges the grant from when it was made (`grown_since`; per-day
usage from the grant's history entry). The Trainer never shrinks a grant: a
lost learner's slot is started again by the LCM within the grant, so what the
job holds (and is charged) stays the grant until its attempt ends.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.states import JobState
from trainforge_services.trainer import admission
from trainforge_services.trainer.lcm_client import Lcm
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.resources import BackendSize, Quota, TeamUse, Usage
from trainforge_services.trainer.store import JobStore

log = logging.getLogger(__name__)

# What the pass reads of ACTIVE jobs for growth, beside what admission reads.
FIELDS = ("grown", "max_learners", "attempt", "active_since")


@dataclass(frozen=True)
class Grant:
    job_id: str
    attempt: int
    was: Usage
    grown: Usage
    learners: int


def per_learner(resources: Usage) -> Usage:
    """One learner's share of what a job holds at its minimum."""
    n = max(1, resources.learners)
    return Usage(resources.gpus // n, resources.cpus / n, resources.memory // n, 1)


def times(one: Usage, k: int) -> Usage:
    return Usage(one.gpus * k, one.cpus * k, one.memory * k, one.learners * k)


def grants(active: Sequence[JobRecord], capacity: BackendSize, quotas: Mapping[str, Quota], *,
           waiting: Iterable[tuple[str, str]] = (), extra: Iterable[tuple[str, Usage, str]] = ()) -> list[Grant]:
    """The grants to make now. `waiting`: (team, reason kind) of each waiting job; `extra`: (team, need,
    gpu type) held beside `active` (jobs dispatched by this pass)."""
    waiting = list(waiting)
    if any(kind != "quota" for _, kind in waiting):
        return []
    blocked = {team for team, _ in waiting}
    held = [(j.team, j.holds, j.gpu_type) for j in active] + list(extra)
    in_use = admission.total(need for _, need, _ in held)
    use = admission.team_use(held)
    out = []
    candidates = sorted((j for j in active if j.state == JobState.RUNNING and j.max_learners > j.holds.learners
                         and j.team not in blocked), key=lambda j: (j.active_since or 0.0, j.id))
    for job in candidates:
        one = per_learner(job.resources)
        quota = dataclasses.replace(quotas.get(job.team, admission.NO_QUOTA), jobs=None)  # it has its slot
        team = use.get(job.team, TeamUse())
        k = 0
        while job.holds.learners + k < job.max_learners:
            need = times(one, k + 1)
            if admission.shortfall(need, capacity.total, in_use) is not None \
                    or admission.over_quota(need, job.gpu_type, quota, team) is not None:
                break
            k += 1
        if not k:
            continue
        more = times(one, k)
        in_use = in_use + more
        by_type = dict(team.gpus_by_type)
        if job.gpu_type and more.gpus:
            by_type[job.gpu_type] = by_type.get(job.gpu_type, 0) + more.gpus
        use[job.team] = TeamUse(team.usage + more, team.jobs, by_type)
        out.append(Grant(job.id, job.attempt, job.grown, job.grown + more, job.holds.learners + k))
    return out


class Grower:
    """Makes the grants of a pass and sends every unacknowledged one to the LCM, off the pass's thread."""

    def __init__(self, store: JobStore, lcm: Lcm, submit: Callable[..., object]):
        self._store, self._lcm, self._submit = store, lcm, submit
        self._acked: dict[str, tuple[int, int]] = {}  # job -> (attempt, learners) the LCM answered
        self._sending: set[tuple[str, int, int]] = set()

    def run(self, active: Sequence[JobRecord], capacity: BackendSize, quotas: Mapping[str, Quota], *,
            fence: int | None = None, **kw) -> None:
        """`fence`: the pass's term (services/trainer/fence.py); a grant under an older one raises `Deposed`."""
        granted = {}
        for grant in grants(active, capacity, quotas, **kw):
            if self._store.grant(grant.job_id, grant.attempt, grant.was, grant.grown, fence=fence,
                                 reason=f"granted {grant.learners} learner(s) in all"):
                log.info("job %s attempt %d: granted %d learner(s) (room no queued job waits for)", grant.job_id,
                         grant.attempt, grant.learners)
                granted[grant.job_id] = (grant.attempt, grant.learners)
        running = {j.id: (j.attempt, j.holds.learners) for j in active
                   if j.state == JobState.RUNNING and j.max_learners and j.grown.learners}
        running.update(granted)
        self._acked = {k: v for k, v in self._acked.items() if running.get(k) == v}
        for job_id, (attempt, learners) in running.items():
            if job_id not in self._acked and (job_id, attempt, learners) not in self._sending:
                self._sending.add((job_id, attempt, learners))
                self._submit(self._send, job_id, attempt, learners)

    def _send(self, job_id: str, attempt: int, learners: int) -> None:
        try:
            # answered (False too: that attempt no longer runs there, and asking again will not change it)
            self._lcm.grow_job(job_id, attempt, learners)
            self._acked[job_id] = (attempt, learners)
        except TrainforgeError as e:
            log.info("job %s: grant of %d learner(s) not delivered yet: %s", job_id, learners, e.message)
        finally:
            self._sending.discard((job_id, attempt, learners))

"""Each job's own credentials: minted when an attempt is handed to the backend, revoked when the job goes.

An `Issuer` stands for one system a job's processes reach (etcd, the
Trainer's gRPC, the object store, ...). For an attempt it makes sure the
job's credential exists there (idempotently: a redeploy, a restarted monitor
or a restarted LCM gets the same one, see common/jobcreds.py) and says which
env vars carry it to the controllers and the monitor, and which of the
platform's own env vars they must no longer inherit. `revoke` removes it when
the LCM removes the job (KillJob, or an attempt replaced by a later one is
followed by the later attempt's grant).

`Credentials` combines the issuers the LCM runs with; with none, a grant
only withholds the service keys no job process ever needs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from trainforge_services.common import jobcreds
from trainforge_services.common.errors import Unavailable, message_of
from trainforge_services.lcm.backends.base import SERVICE_KEYS, AttemptPlan, Grant

log = logging.getLogger(__name__)



class Issuer(Protocol):
    """One kind of per-job credential."""

    name: str

    def grant(self, plan: AttemptPlan) -> Grant:
        """Make sure the job's credential exists; the env vars that carry it. Idempotent per job."""
        ...

    def revoke(self, job_id: str) -> None:
        """Remove the job's credential (its next use is refused). Idempotent; a missing one is fine."""
        ...


class MonitorToken:
    """The job monitor's token to the Trainer's gRPC, in the monitor's env only (TF_MONITOR_TOKEN).

    Derived from the credentials key, so there is nothing to store or delete: the Trainer derives it again
    to check it, takes it only for that job's reports, and refuses it once the job has ended and its
    learners are removed (common/rpcauth.py, trainer/job_service.py `report`).
    """

    name = jobcreds.MONITOR

    def __init__(self, key: bytes):
        self._key = key

    def grant(self, plan: AttemptPlan) -> Grant:
        return Grant(monitor={"TF_MONITOR_TOKEN": jobcreds.derive(self._key, jobcreds.MONITOR, plan.job_id)})

    def revoke(self, job_id: str) -> None:
        """Nothing to remove: the Trainer's record of the job revokes it."""


class Credentials:
    """The issuers of one LCM, applied in order; later ones win where two set one variable."""

    def __init__(self, issuers: Sequence[Issuer] = ()):
        self._issuers = tuple(issuers)

    @property
    def issuers(self) -> tuple[Issuer, ...]:
        return self._issuers

    def grant(self, plan: AttemptPlan) -> Grant:
        controller: dict[str, str] = {}
        monitor: dict[str, str] = {}
        withheld = set(SERVICE_KEYS)
        for issuer in self._issuers:
            g = issuer.grant(plan)
            controller.update(g.controller)
            monitor.update(g.monitor)
            withheld.update(g.withheld)
        return Grant(controller=controller, monitor=monitor, withheld=tuple(sorted(withheld)))

    def attach(self, plan: AttemptPlan) -> AttemptPlan:
        """`plan` carrying its grant, as every backend call that starts a process of it needs."""
        return plan.model_copy(update={"grant": self.grant(plan)})

    def revoke(self, job_id: str) -> None:
        """Revoke the job's credentials at every issuer. Each is tried; if any failed, Unavailable naming them
        afterwards, so the caller's KillJob fails and is asked again (revoking is idempotent)."""
        failed = []
        for issuer in self._issuers:
            try:
                issuer.revoke(job_id)
            except Exception as e:  # noqa: BLE001 - every issuer is tried; the failures are raised together
                log.warning("job %s: revoking its %s credential failed: %s", job_id, issuer.name, message_of(e))
                failed.append(f"{issuer.name}: {message_of(e)}")
        if failed:
            raise Unavailable(f"job {job_id}: its credentials could not all be revoked ({'; '.join(failed)})")

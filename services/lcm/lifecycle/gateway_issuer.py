"""The job gateway's credentials: a job's controllers reach the object and log stores only through the API.

`GatewayIssuer` grants each controller its job's token and ticket
(services/common/jobgateway.py) and the gateway's URL, and withholds the
platform's object-store keys and log-store address, so nothing a controller
holds (and so nothing a learner beside it could read) opens another job's
objects or lines. Both values are derived from the credentials key, so
nothing is stored: the gateway refuses them once the Trainer calls the job
finished, which is the revocation.
"""

from __future__ import annotations

from trainforge_services.common import jobgateway
from trainforge_services.common.jobgateway import Ticket
from trainforge_services.lcm.backends.base import AttemptPlan, Grant

# what no controller inherits once the gateway serves it: the store keys, and the log store's address
WITHHELD = ("TF_S3_ACCESS_KEY", "TF_S3_SECRET_KEY", "TF_LOGSTORE_URL")


class GatewayIssuer:
    name = "job gateway"

    def __init__(self, key: bytes, gateway_url: str):
        if not gateway_url.startswith(("http://", "https://")):
            raise ValueError(f"gateway_url (TF_GATEWAY_URL) must be an http:// or https:// URL, got {gateway_url!r}")
        self._key, self._url = key, gateway_url.rstrip("/")

    def grant(self, plan: AttemptPlan) -> Grant:
        ticket = jobgateway.make_ticket(self._key, Ticket(plan.job_id, plan.team, tuple(plan.reads)))
        return Grant(controller={jobgateway.URL_ENV: self._url,
                                 jobgateway.TOKEN_ENV: jobgateway.job_token(self._key, plan.job_id),
                                 jobgateway.TICKET_ENV: ticket},
                     withheld=WITHHELD)

    def revoke(self, job_id: str) -> None:
        """Nothing to remove: the gateway asks the Trainer whether the job has finished on every call."""

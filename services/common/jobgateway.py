"""The job gateway's contract: how a job's controller proves who it is to the API's gateway routes.

A job's controller holds no object-store or log-store credential of the
platform's. It reaches both through the API's gateway
(`/internal/gateway/jobs/<id>/...`, services/api/gateway.py) with two values
the LCM grants it at deploy (services/lcm/gateway.py):

- the job's token, `derive(key, "job", job_id)` (common/jobcreds.py), sent
  as `Authorization: Bearer <token>`;
- the job's ticket: what the Trainer admitted the job to read besides its own
  `jobs/<id>/` (its `reads`) and its team, signed under the same key, sent as
  the `X-Trainforge-Job-Ticket` header. The gateway needs no store of its own
  to know them, and a controller cannot widen them.

Both are derived from the credentials key, so the API, the LCM and the
Trainer agree on them without storing anything per job. The gateway accepts
them only while the Trainer says the job is not finished.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from trainforge_services.common.errors import PermissionDenied
from trainforge_services.common.jobcreds import derive, matches

# the env vars a controller gets from its grant
TOKEN_ENV = "TF_JOB_TOKEN"
TICKET_ENV = "TF_JOB_TICKET"
URL_ENV = "TF_GATEWAY_URL"
TICKET_HEADER = "X-Trainforge-Job-Ticket"
PREFIX = "/internal/gateway/jobs"
TOKEN_PURPOSE = "job"
TICKET_PURPOSE = "job-ticket"
# the log-store indexes a job may write to through the gateway: its log and its training metrics
LOG_STREAMS = ("log", "metrics")


@dataclass(frozen=True)
class Ticket:
    job_id: str
    team: str
    reads: tuple[str, ...]


def job_token(key: bytes, job_id: str) -> str:
    return derive(key, TOKEN_PURPOSE, job_id)


def _payload(ticket: Ticket) -> str:
    doc = {"job": ticket.job_id, "team": ticket.team, "reads": sorted(ticket.reads)}
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def make_ticket(key: bytes, ticket: Ticket) -> str:
    """`<payload>.<mac>`: the job's team and reads, signed for that job under the credentials key."""
    payload = _payload(ticket)
    return payload + "." + derive(key, TICKET_PURPOSE + "\0" + payload, ticket.job_id)


def read_ticket(key: bytes, job_id: str, text: str) -> Ticket:
    """The ticket `text` carries for `job_id`; PermissionDenied when it is not one the key signed for it."""
    payload, _, mac = text.strip().partition(".")
    if not payload or not mac or not matches(key, TICKET_PURPOSE + "\0" + payload, job_id, mac):
        raise PermissionDenied(f"the job ticket ({TICKET_HEADER}) is not one issued to job {job_id}")
    doc = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    if doc.get("job") != job_id:
        raise PermissionDenied(f"the job ticket names job {doc.get('job')!r}, not {job_id}")
    return Ticket(job_id, str(doc.get("team", "")), tuple(doc.get("reads") or ()))


def check_token(key: bytes, job_id: str, authorization: str) -> None:
    """PermissionDenied unless `authorization` is `Bearer <the job's token>`."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token or not matches(key, TOKEN_PURPOSE, job_id, token.strip()):
        raise PermissionDenied(f"the gateway takes only job {job_id}'s own token (Authorization: Bearer ...)")

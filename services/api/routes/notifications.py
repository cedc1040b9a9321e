"""Webhook notifications over HTTP: a job's deliveries, the team's default webhook, every delivery for admins.

The Trainer delivers (services/trainer/notifier.py); the API only reads the
outbox and sets the team default. A job's deliveries are tenant-scoped like
every job route (the Trainer is asked for the job first, so another team's
job is 404). Team admins see their signing secret, which their receiver
needs to verify `X-Trainforge-Signature`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from trainforge_services.api.deps import (
    PlatformAdminDep,
    TeamAdminDep,
    TenantDep,
    TrainerDep,
    WebhookPolicyDep,
)
from trainforge_services.api.schemas import error_responses
from trainforge_services.common.contracts.ids import check_job_id
from trainforge_services.common.secrets import SecretBox, load_key
from trainforge_services.common.webhooks import Outbox, TeamWebhooks

router = APIRouter(tags=["notifications"], responses=error_responses(400, 401, 422, 429))

JobId = Annotated[str, Path(description="the job id, e.g. j-1a2b3c4d5e6f", max_length=128)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class DeliveryAttempt(_Frozen):
    at: float
    status_code: int | None = Field(None, description="the receiver's HTTP status; null when it was not reached")
    error: str = ""
    ms: float | None = None


class Delivery(_Frozen):
    id: str = Field(description="also sent as X-Trainforge-Delivery, the same on every try")
    job_id: str
    team: str
    url: str
    event: dict[str, Any] = Field(description="type (job.completed, job.failed, ...), state, reason, seq, at")
    status: str = Field(description="pending, sending, delivered or failed (gave up)")
    tries: int
    created_at: float | None = None
    delivered_at: float | None = None
    refused: str = Field("", description="why the destination was refused (loopback, link-local, the platform's "
                                         "own services; TF_WEBHOOK_ALLOW): the delivery failed without a POST")
    attempts: list[DeliveryAttempt]


class DeliveryList(_Frozen):
    deliveries: list[Delivery]


class TeamWebhook(_Frozen):
    team: str
    webhook: str | None = Field(description="the team's default webhook; null: none")
    signing_secret: str = Field(description="HMAC-SHA256 key of X-Trainforge-Signature (t=<ts>,v1=<hex of "
                                            "HMAC(key, '<ts>.' + body)>)")


class TeamWebhookIn(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    webhook: str | None = Field(description="an http(s) URL, or null to remove the default", max_length=2048,
                                pattern=r"^https?://[^\s]+$", examples=["https://hooks.example.com/trainforge"])


def _outbox(request: Request) -> Outbox:
    return Outbox(request.app.state.identity.db)


def _hooks(request: Request) -> TeamWebhooks:
    settings = request.app.state.settings
    return TeamWebhooks(request.app.state.identity.db, lambda: SecretBox(load_key(
        settings.secrets_key, dev_mode=settings.dev_mode, state_dir=settings.state_dir)))


@router.get("/v1/jobs/{job_id}/notifications", response_model=DeliveryList,
            responses=error_responses(404, e404="no such job in the caller's team"),
            summary="A job's webhook deliveries and every attempt of each")
def job_notifications(tenant: TenantDep, trainer: TrainerDep, job_id: JobId, request: Request) -> dict:
    check_job_id(job_id)
    trainer.get_job(tenant.team, job_id)
    return {"deliveries": _outbox(request).for_job(job_id, tenant.team)}


@router.get("/v1/team/notifications", response_model=TeamWebhook, responses=error_responses(403),
            summary="The team's default webhook and signing secret")
def team_webhook(tenant: TeamAdminDep, request: Request) -> dict:
    return _hooks(request).describe(tenant.team)


@router.put("/v1/team/notifications", response_model=TeamWebhook, responses=error_responses(403),
            summary="Set (or remove) the team's default webhook")
def set_team_webhook(tenant: TeamAdminDep, body: TeamWebhookIn, request: Request, policy: WebhookPolicyDep) -> dict:
    """Every job of the team announces its terminal and halted states here, besides its own `notify:`. A
    destination in the platform's own network is refused (422) unless the admin's TF_WEBHOOK_ALLOW allows it."""
    if body.webhook is not None:
        policy.check_url(body.webhook)
    return _hooks(request).set_default(tenant.team, body.webhook)


@router.get("/v1/admin/notifications", response_model=DeliveryList, responses=error_responses(403),
            summary="Webhook deliveries of every team, newest first")
def all_notifications(
    _: PlatformAdminDep, request: Request,
    team: Annotated[str | None, Query(max_length=63, description="only this team's")] = None,
    status: Annotated[str | None, Query(pattern="^(pending|sending|delivered|failed)$")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict:
    return {"deliveries": _outbox(request).recent(team=team, status=status, limit=limit)}

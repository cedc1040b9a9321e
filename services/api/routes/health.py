"""/healthz: unauthenticated, for load balancers and `trainforge up`."""

from __future__ import annotations

from fastapi import APIRouter, Response

from trainforge_services.api import health
from trainforge_services.api.deps import IdentityDep, LogsDep, TrainerDep
from trainforge_services.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Whether the API and what it needs are up",
            responses={503: {"model": Health, "description": "a component is unavailable"}})
def healthz(trainer: TrainerDep, identity: IdentityDep, logs: LogsDep, response: Response) -> dict:
    """200 when the Trainer, MongoDB and the log store answer; 503 naming the ones that do not."""
    ok, body = health.check(trainer, identity, logs)
    if not ok:
        response.status_code = 503
    return body

"""/internal/gateway/jobs/{id}/...: a job's controller reaches the object and log stores through these.

Authenticated by the job's own token and ticket (services/common/jobgateway.py), never by an API key; the
scope rules are services/api/gateway.py's. Left out of the public OpenAPI document: only controllers call it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from trainforge_services.api.gateway import JobGateway
from trainforge_services.common import jobgateway
from trainforge_services.common.adapters.objectstore import ObjectInfo
from trainforge_services.common.contracts.ids import check_job_id
from trainforge_services.common.errors import Unavailable
from trainforge_services.common.jobgateway import Ticket

router = APIRouter(prefix=jobgateway.PREFIX, include_in_schema=False)

JobId = Annotated[str, Path(max_length=128)]
Key = Field(min_length=1, max_length=1024)


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KeyBody(_Body):
    key: str = Key


class PrefixBody(_Body):
    prefix: str = Key


class WriteBody(_Body):
    key: str = Key
    sha256: str = Field(min_length=64, max_length=64)


def _gateway(request: Request) -> JobGateway:
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is None:
        raise Unavailable("this API runs no job gateway (it has no credentials key)")
    return gateway


GatewayDep = Annotated[JobGateway, Depends(_gateway)]


def _ticket(gateway: GatewayDep, job_id: JobId,
            authorization: Annotated[str, Header()] = "",
            x_trainforge_job_ticket: Annotated[str, Header()] = "") -> Ticket:
    check_job_id(job_id, "job_id")
    return gateway.admit(job_id, authorization, x_trainforge_job_ticket)


TicketDep = Annotated[Ticket, Depends(_ticket)]


def _info(info: ObjectInfo) -> dict:
    return {"key": info.key, "size": info.size, "sha256": info.sha256}


@router.post("/{job_id}/objects/list")
def list_objects(gateway: GatewayDep, ticket: TicketDep, body: PrefixBody) -> dict:
    return {"objects": [_info(i) for i in gateway.list(ticket, body.prefix)]}


@router.post("/{job_id}/objects/info")
def object_info(gateway: GatewayDep, ticket: TicketDep, body: KeyBody) -> dict:
    return _info(gateway.info(ticket, body.key))


@router.post("/{job_id}/objects/read")
def read_object(gateway: GatewayDep, ticket: TicketDep, body: KeyBody) -> dict:
    info, url = gateway.read_url(ticket, body.key)
    return {**_info(info), "url": url}


@router.post("/{job_id}/objects/write")
def write_object(gateway: GatewayDep, ticket: TicketDep, body: WriteBody) -> dict:
    url, headers = gateway.write_url(ticket, body.key, body.sha256)
    return {"url": url, "headers": headers}


@router.post("/{job_id}/objects/delete")
def delete_objects(gateway: GatewayDep, ticket: TicketDep, body: PrefixBody) -> dict:
    return {"deleted": gateway.delete(ticket, body.prefix)}


@router.post("/{job_id}/logs/{stream}")
async def write_lines(gateway: GatewayDep, ticket: TicketDep, request: Request, stream: str) -> dict:
    body = await request.body()
    return {"written": await run_in_threadpool(gateway.write_lines, ticket, stream, body)}

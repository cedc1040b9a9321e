"""/v1/admin: every team, quotas, usage, keys and the audit log — platform admins only.

Every route here takes `PlatformAdminDep`, so team admins and members get
403 before anything is looked up.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response

from trainforge_services.api import access, paging, usage
from trainforge_services.api.audit import note_target
from trainforge_services.api.deps import AuditDep, IdentityDep, PlatformAdminDep, TrainerDep
from trainforge_services.api.schemas import error_responses
from trainforge_services.api.schemas_quota import Cluster, QuotaIn, TeamUsage, UsageList
from trainforge_services.api.schemas_teams import (
    ApiKey,
    AuditPage,
    IssuedKey,
    KeyIn,
    KeyList,
    Publication,
    PublicationIn,
    PublicationList,
    Team,
    TeamIn,
    TeamList,
)

router = APIRouter(prefix="/v1/admin", tags=["admin"],
                   responses=error_responses(400, 401, 403, 422, 429))

TeamName = Annotated[str, Path(description="the team's name", max_length=63)]
KeyId = Annotated[str, Path(description="the key's id, e.g. 1a2b3c4d", max_length=64)]
_NO_TEAM = error_responses(404, e404="no such team")


@router.get("/teams", response_model=TeamList, summary="Every team")
def list_teams(_: PlatformAdminDep, identity: IdentityDep) -> dict:
    return {"teams": identity.list_teams()}


@router.post("/teams", status_code=201, response_model=Team, summary="Create a team",
             responses=error_responses(409, e409="the team exists already"))
def create_team(_: PlatformAdminDep, identity: IdentityDep, body: TeamIn, request: Request) -> dict:
    note_target(request, body.name, team=body.name)
    return access.create_team(identity, body.name)


@router.get("/teams/{team}", response_model=Team, responses=_NO_TEAM, summary="One team")
def get_team(_: PlatformAdminDep, identity: IdentityDep, team: TeamName) -> dict:
    return identity.team(team)


@router.post("/teams/{team}/disable", response_model=Team, summary="Disable a team",
             responses={**_NO_TEAM, **error_responses(409, e409="that is the caller's own team")})
def disable_team(tenant: PlatformAdminDep, identity: IdentityDep, team: TeamName) -> dict:
    """From the next request on, the team's keys and tokens are answered 401; its jobs are left alone."""
    return access.set_team_disabled(identity, tenant, team, True)


@router.post("/teams/{team}/enable", response_model=Team, responses=_NO_TEAM, summary="Enable a team again")
def enable_team(tenant: PlatformAdminDep, identity: IdentityDep, team: TeamName) -> dict:
    return access.set_team_disabled(identity, tenant, team, False)


@router.put("/teams/{team}/quota", response_model=TeamUsage, responses=_NO_TEAM, summary="Set a team's quota")
def set_quota(tenant: PlatformAdminDep, identity: IdentityDep, trainer: TrainerDep, team: TeamName,
              body: QuotaIn) -> dict:
    """Replaces the quota whole: a limit left out is no limit of the team's own. Applies from the
    Trainer's next dispatch pass; running jobs are not stopped."""
    return access.set_quota(identity, trainer, tenant, team, body)


@router.get("/teams/{team}/usage", response_model=TeamUsage, responses=_NO_TEAM, summary="A team's quota and usage")
def team_usage(_: PlatformAdminDep, identity: IdentityDep, trainer: TrainerDep, team: TeamName) -> dict:
    return access.team_usage(identity, trainer, team)


_USAGE_CSV = {200: {"content": {"text/csv": {}}, "description": "RFC 4180, a header row"}}
Since = Annotated[str | None, Query(max_length=40, description=(
    "accounting from this time: ISO-8601 (UTC when no offset; a date is its midnight) or unix seconds"))]
Until = Annotated[str | None, Query(max_length=40, description="accounting until this time (exclusive); default now")]
GroupBy = Annotated[str, Query(max_length=20, description="only 'day' (UTC)")]


@router.get("/cluster", response_model=Cluster, summary="The backend's capacity and what every team holds of it")
def cluster(_: PlatformAdminDep, trainer: TrainerDep) -> dict:
    """The capacity as the LCM last reported it to the Trainer (`known` false, with the reason, before it
    has), what active jobs of every team hold now, what is free, and the active and queued job counts."""
    return trainer.cluster()


@router.get("/usage", response_model=UsageList, summary="Every team's quota and usage; per-day accounting",
            responses=_USAGE_CSV)
def list_usage(_: PlatformAdminDep, trainer: TrainerDep, identity: IdentityDep, since: Since = None,
               until: Until = None, group_by: GroupBy = "day",
               format: Annotated[Literal["json", "csv"], Query(description="csv: the accounting as CSV")] = "json",
               ) -> dict | Response:
    """Without `since`: each team's quota, what it holds now and its running totals. With `since`:
    also `accounting`, GPU-seconds by GPU type, CPU-seconds, memory-GiB-seconds and job counts per
    team per UTC day, computed now from the jobs' status histories (running jobs count up to now)."""
    if since is None and until is None and format == "json":
        return {"teams": trainer.list_usage()}
    report = usage.collect(trainer, [t["name"] for t in identity.list_teams()],
                           *usage.window(since, until, group_by, time.time()), time.time())
    if format == "csv":
        return _csv(report)
    return {"teams": trainer.list_usage(), "accounting": report}


@router.get("/usage.csv", summary="Per-day accounting as CSV (RFC 4180)", response_class=Response,
            responses=_USAGE_CSV)
def usage_csv(_: PlatformAdminDep, trainer: TrainerDep, identity: IdentityDep, since: Since = None,
              until: Until = None, group_by: GroupBy = "day") -> Response:
    report = usage.collect(trainer, [t["name"] for t in identity.list_teams()],
                           *usage.window(since, until, group_by, time.time()), time.time())
    return _csv(report)


def _csv(report: usage.UsageReport) -> Response:
    name = f"usage-{usage.day_name(report.since)}-{usage.day_name(report.until)}.csv"
    return Response(usage.to_csv(report), media_type="text/csv; charset=utf-8; header=present",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/teams/{team}/keys", response_model=KeyList, responses=_NO_TEAM, summary="A team's API keys")
def list_keys(_: PlatformAdminDep, identity: IdentityDep, team: TeamName) -> dict:
    identity.team(team)
    return {"keys": identity.list_keys(team)}


@router.post("/teams/{team}/keys", status_code=201, response_model=IssuedKey,
             responses={**_NO_TEAM, **error_responses(409, e409="the team is disabled")},
             summary="Issue an API key for any team")
def issue_key(tenant: PlatformAdminDep, identity: IdentityDep, team: TeamName, body: KeyIn,
              request: Request) -> dict:
    """The response carries the key itself, once; the platform keeps only its hash."""
    issued = access.issue_key(identity, tenant, team, body)
    note_target(request, issued["key_id"], team=team)
    return issued


@router.delete("/keys/{key_id}", response_model=ApiKey, responses=error_responses(404, e404="no such key"),
               summary="Revoke any API key")
def revoke_key(_: PlatformAdminDep, identity: IdentityDep, key_id: KeyId, request: Request) -> dict:
    revoked = identity.revoke_key(key_id)
    note_target(request, key_id, team=revoked["team"])
    return revoked


@router.get("/audit", response_model=AuditPage, summary="The audit log, newest first")
def audit_log(
    _: PlatformAdminDep, audit: AuditDep,
    team: Annotated[str | None, Query(max_length=63, description="entries by or about this team")] = None,
    since: Annotated[dt.datetime | float | None, Query(
        description="only entries at or after this time: ISO-8601 (UTC when no offset) or unix seconds")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="most entries returned")] = 100,
    until: Annotated[float | dt.datetime | None, Query(description="only entries before this time")] = None,
    cursor: Annotated[str | None, Query(max_length=512, description="`next_cursor` of the previous page")] = None,
) -> dict:
    """Every state-changing request (POST, PUT, PATCH, DELETE): who, what, when, and its HTTP status.
    Pages of at most `limit` entries; `next_cursor` is null on the last page."""
    before = paging.decode(cursor)
    entries, next_cursor = paging.page(
        lambda n: audit.query(team=team, since=access.unix(since, "since"), until=access.unix(until, "until"),
                              limit=n, before=before), limit, lambda e: (float(e["ts"]), e["id"]))
    return {"entries": entries, "next_cursor": next_cursor}


@router.get("/published", response_model=PublicationList, summary="Every published object-store prefix")
def list_published(_: PlatformAdminDep, trainer: TrainerDep) -> dict:
    """Prefixes jobs may read besides their team's own objects, and the teams each is published to."""
    return {"publications": trainer.publications()}


@router.put("/published", response_model=Publication, summary="Publish an object-store prefix to teams")
def publish(tenant: PlatformAdminDep, trainer: TrainerDep, body: PublicationIn, request: Request) -> dict:
    """Jobs of these teams (["*"]: every team) may read objects under the prefix, e.g. a data set in
    `data:`; replaces whom it was published to. A prefix under store://jobs/ or store://experiments/
    names teams' own objects and is refused."""
    note_target(request, body.prefix)
    return trainer.set_publication(body.prefix, body.teams, actor=tenant.key_id)


@router.delete("/published", response_model=Publication, responses=error_responses(404, e404="not published"),
               summary="Withdraw a published prefix")
def withdraw(tenant: PlatformAdminDep, trainer: TrainerDep, request: Request,
             prefix: Annotated[str, Query(max_length=1024, description="the store:// prefix")]) -> dict:
    """Jobs submitted or deployed from now on may no longer read it; a running attempt keeps what it fetched."""
    note_target(request, prefix)
    return trainer.set_publication(prefix, [], actor=tenant.key_id)

"""The REST shapes of teams, API keys, the caller, published prefixes and the audit log."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

ROLE_DESCRIPTION = "member, team_admin or platform_admin"


class Whoami(BaseModel):
    team: str
    key_id: str = Field(description="the API key's id (a token's `sub`)")
    role: str = Field(description=ROLE_DESCRIPTION)
    via: str = Field(description='"key" for an API key, "jwt" for a token')


class Token(BaseModel):
    token: str = Field(description="a JWT; send it as `Authorization: Bearer <token>`")
    token_type: str = Field("bearer")
    expires_at: float = Field(description="unix time, seconds; never later than the key's own expiry")
    expires_in: int = Field(description="seconds from now")


class Team(BaseModel):
    name: str
    created_at: float
    disabled: bool = Field(description="a disabled team's keys and tokens are answered 401")
    disabled_at: float | None


class TeamList(BaseModel):
    teams: list[Team]


class TeamIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", max_length=63,
                      description="1-63 lowercase letters, digits or '-'", examples=["ml-research"])


class ApiKey(BaseModel):
    key_id: str = Field(description="public id of the key (its lookup prefix)")
    team: str
    name: str = Field(description="whose or what the key is")
    role: str = Field(description=ROLE_DESCRIPTION)
    created_at: float
    created_by: str = Field(description="id of the key that issued it; empty when issued from the shell")
    last_used_at: float | None = Field(description="unix time of the last use, to about a minute")
    expires_at: float | None
    revoked: bool
    revoked_at: float | None


class IssuedKey(ApiKey):
    key: str = Field(description="the key itself; shown only in this response, never again")


class KeyList(BaseModel):
    keys: list[ApiKey]


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$",
                      description="whose or what the key is, e.g. alice or ci", examples=["ci"])
    role: Literal["member", "team_admin", "platform_admin"] = Field(
        "member", description="no higher than the caller's own role")
    expires_at: dt.datetime | None = Field(
        None, description="ISO-8601 (UTC when no offset); must be in the future (a past time is answered 422 "
                          "naming expires_at); none: never expires")


# -- the audit log ------------------------------------------------------------------------------------

class RefusedReference(BaseModel):
    field: str = Field(description="the manifest field or setting, e.g. requirements, notify.webhook")
    source: str = Field(description="where: the requirements file and line, or the URL")
    rule: str = Field(description="the rule it broke")


class AuditEntry(BaseModel):
    id: str
    ts: float = Field(description="unix time, seconds")
    key_id: str = Field(description="the caller's key id (a token's sub); empty when unauthenticated")
    team: str = Field(description="the caller's team")
    role: str
    via: str = Field(description='"key", "jwt", or empty')
    method: str
    route: str = Field(description="route template, e.g. /v1/jobs/{job_id}/cancel")
    path: str
    target: str = Field(description="id of what the request was about (job, key, team)")
    target_team: str = Field(description="the team the request was about")
    status: int = Field(description="HTTP status of the answer")
    refused: list[RefusedReference] = Field(default_factory=list, description="what the request named that the "
                                            "platform will not reach for the tenant (the request was refused)")


class AuditPage(BaseModel):
    entries: list[AuditEntry]
    next_cursor: str | None = Field(None, description="pass back as `cursor` for the next page; null: no more")


# -- publications -------------------------------------------------------------------------------

class PublicationIn(BaseModel):
    """An object-store prefix to publish, and to whom."""

    model_config = ConfigDict(extra="forbid")

    prefix: str = Field(max_length=1024, description="a store:// prefix, e.g. store://datasets/mnist/; never "
                                                     "under store://jobs/ or store://experiments/",
                        examples=["store://datasets/mnist/"])
    teams: list[Annotated[str, Field(max_length=63)]] = Field(
        min_length=1, max_length=1000, description='team names, or ["*"] for every team', examples=[["vision"]])


class Publication(BaseModel):
    prefix: str = Field(description="the store:// prefix, with its trailing slash")
    teams: list[str] = Field(description='the teams whose jobs may read it; ["*"]: every team')


class PublicationList(BaseModel):
    publications: list[Publication]

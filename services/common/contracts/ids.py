"""Job ids: one rule and one generator.

A job id becomes an etcd key segment, a directory name, an object-store key
segment and (on Kubernetes) part of object names and label values, so the
rule is the strictest of these: a DNS-1123 label (lowercase letters, digits
and '-', starting and ending alphanumeric) of at most 40 characters, which
leaves room for the suffixes a backend adds to name a learner.
"""

from __future__ import annotations

import hashlib
import re
import secrets

from trainforge_services.common.errors import InvalidArgument

MAX_LEN = 40
_JOB_ID = re.compile(rf"^[a-z0-9](?:[a-z0-9-]{{0,{MAX_LEN - 2}}}[a-z0-9])?$")
# The same rule as a regular expression, for schemas (the REST API's OpenAPI path parameters).
PATTERN = _JOB_ID.pattern
RULE = f"1-{MAX_LEN} lowercase letters, digits or '-', starting and ending with a letter or digit"


def is_job_id(value: str) -> bool:
    return bool(_JOB_ID.match(value or ""))


def check_job_id(value: str, field: str = "job_id") -> str:
    """`value` when it is a valid job id; InvalidArgument naming `field` otherwise."""
    if not is_job_id(value):
        raise InvalidArgument(f"{field} {value!r} is not valid: use {RULE}",
                              details=[{"field": field, "message": f"must be {RULE}"}])
    return value


def new_job_id(team: str = "", idempotency_key: str | None = None) -> str:
    """A fresh job id; with an idempotency key, the same id for the same (team, key) every time."""
    if idempotency_key:
        return "j-" + hashlib.sha256(f"{team}\0{idempotency_key}".encode()).hexdigest()[:12]
    return "j-" + secrets.token_hex(6)


def new_experiment_id() -> str:
    """A fresh experiment id; its trials' job ids are `<experiment>-<index>[-<gen>]`, so it is kept short."""
    return "x-" + secrets.token_hex(6)


def new_workflow_id() -> str:
    """A fresh workflow id; node i's experiment is `<workflow>-<i>`."""
    return "w-" + secrets.token_hex(6)

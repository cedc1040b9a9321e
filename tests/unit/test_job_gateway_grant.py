"""The job gateway's token and ticket, and what the LCM's GatewayIssuer grants and withholds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainforge_services.common import jobgateway
from trainforge_services.common.errors import PermissionDenied
from trainforge_services.common.jobgateway import Ticket
from trainforge_services.lcm.backends.base import Role
from trainforge_services.lcm.lifecycle.credentials import Credentials
from trainforge_services.lcm.lifecycle.gateway_issuer import GatewayIssuer

KEY = b"k" * 32


def test_a_ticket_reads_back_only_for_its_job_and_key():
    text = jobgateway.make_ticket(KEY, Ticket("j-1", "alpha", ("datasets/b/", "datasets/a/")))
    assert jobgateway.read_ticket(KEY, "j-1", text) == Ticket("j-1", "alpha", ("datasets/a/", "datasets/b/"))
    payload, _, mac = text.partition(".")
    widened = jobgateway.make_ticket(b"x" * 32, Ticket("j-1", "alpha", ("jobs/",))).partition(".")[0]
    for bad, who in ((text, "j-2"), (f"{widened}.{mac}", "j-1"), (payload, "j-1"), ("", "j-1"),
                     (jobgateway.make_ticket(b"x" * 32, Ticket("j-1", "alpha", ())), "j-1")):
        with pytest.raises(PermissionDenied, match="ticket"):
            jobgateway.read_ticket(KEY, who, bad)


def test_the_token_is_the_jobs_own():
    jobgateway.check_token(KEY, "j-1", f"Bearer {jobgateway.job_token(KEY, 'j-1')}")
    for header in (f"Bearer {jobgateway.job_token(KEY, 'j-2')}", jobgateway.job_token(KEY, "j-1"), "", "Bearer "):
        with pytest.raises(PermissionDenied, match="token"):
            jobgateway.check_token(KEY, "j-1", header)


def test_controllers_get_the_gateway_and_lose_the_store_credentials():
    plan = SimpleNamespace(job_id="j-1", team="alpha", reads=("datasets/a/",))
    grant = Credentials([GatewayIssuer(KEY, "http://127.0.0.1:8080/")]).grant(plan)
    platform = {"TF_S3_ACCESS_KEY": "ak", "TF_S3_SECRET_KEY": "sk", "TF_LOGSTORE_URL": "http://es",
                "TF_ETCD_ENDPOINTS": "e:1"}
    env = grant.env_for(Role.CONTROLLER, platform)
    assert not {"TF_S3_ACCESS_KEY", "TF_S3_SECRET_KEY", "TF_LOGSTORE_URL"} & set(env)
    assert env["TF_GATEWAY_URL"] == "http://127.0.0.1:8080" and env["TF_ETCD_ENDPOINTS"] == "e:1"
    jobgateway.check_token(KEY, "j-1", f"Bearer {env['TF_JOB_TOKEN']}")
    assert jobgateway.read_ticket(KEY, "j-1", env["TF_JOB_TICKET"]) == Ticket("j-1", "alpha", ("datasets/a/",))
    assert "TF_JOB_TOKEN" not in grant.env_for(Role.MONITOR, platform)
    with pytest.raises(ValueError, match="gateway_url"):
        GatewayIssuer(KEY, "127.0.0.1:8080")

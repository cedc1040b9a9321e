"""The service token and the monitor's own token (common/rpcauth.py, lifecycle/credentials.py MonitorToken)."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest

from trainforge_services.common import jobcreds, rpcauth
from trainforge_services.lcm.backends.base import Role
from trainforge_services.lcm.lifecycle.credentials import SERVICE_KEYS, Credentials, MonitorToken

KEY = b"k" * 32


def test_the_service_token_is_a_setting_or_made_once_in_dev_mode(tmp_path):
    with pytest.raises(ValueError, match=r"service_token \(TF_SERVICE_TOKEN\) is required outside dev mode"):
        rpcauth.load_service_token("", dev_mode=False, state_dir=tmp_path)
    with pytest.raises(ValueError, match="service_token .* at least 32 characters"):
        rpcauth.load_service_token("short", dev_mode=True, state_dir=tmp_path)
    assert rpcauth.load_service_token("t" * 40, dev_mode=False, state_dir=tmp_path) == "t" * 40
    made = rpcauth.load_service_token("", dev_mode=True, state_dir=tmp_path)
    assert len(made) >= 32 and made == rpcauth.load_service_token("", dev_mode=True, state_dir=tmp_path)
    assert stat.S_IMODE(os.stat(tmp_path / rpcauth.TOKEN_FILE).st_mode) == 0o600
    settings = SimpleNamespace(service_token="", dev_mode=True, state_dir=tmp_path)
    assert rpcauth.service_authorization(settings) == f"Bearer {made}"


def test_a_job_process_never_inherits_the_service_token_and_only_the_monitor_gets_its_token():
    grant = Credentials([MonitorToken(KEY)]).grant(SimpleNamespace(job_id="job-1"))
    assert "TF_SERVICE_TOKEN" in SERVICE_KEYS
    platform = {"TF_SERVICE_TOKEN": "s" * 40, "TF_CREDENTIALS_KEY": "c" * 40, "TF_ETCD_ENDPOINTS": "e:2379"}
    monitor = grant.env_for(Role.MONITOR, platform)
    assert monitor == {"TF_ETCD_ENDPOINTS": "e:2379",
                       "TF_MONITOR_TOKEN": jobcreds.derive(KEY, jobcreds.MONITOR, "job-1")}
    assert grant.env_for(Role.CONTROLLER, platform) == {"TF_ETCD_ENDPOINTS": "e:2379"}
    assert rpcauth.job_authorization("monitor", "job-1", "tok") == "Job monitor job-1 tok"


def test_a_server_auth_needs_its_keys():
    with pytest.raises(ValueError, match="service token"):
        rpcauth.ServerAuth("")
    with pytest.raises(ValueError, match="credentials key"):
        rpcauth.ServerAuth("t" * 40, b"", {"/x/Y": "monitor"})
    assert rpcauth.caller() == rpcauth.Caller() and not rpcauth.caller().is_job

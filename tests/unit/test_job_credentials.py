"""Per-job credentials: derivation (common/jobcreds.py) and how the lifecycle combines issuers (credentials.py)."""

from __future__ import annotations

import os
import stat

import pytest

from trainforge_services.common import jobcreds
from trainforge_services.common.errors import Unavailable
from trainforge_services.lcm.backends.base import Grant, Role
from trainforge_services.lcm.lifecycle.credentials import SERVICE_KEYS, Credentials

KEY = b"k" * 32


def test_derive_is_stable_per_job_and_purpose_and_differs_otherwise():
    a = jobcreds.derive(KEY, "etcd", "job-1")
    assert a == jobcreds.derive(KEY, "etcd", "job-1") and len(a) == 43
    assert a != jobcreds.derive(KEY, "etcd", "job-2")
    assert a != jobcreds.derive(KEY, "monitor", "job-1")
    assert a != jobcreds.derive(b"x" * 32, "etcd", "job-1")
    assert jobcreds.matches(KEY, "etcd", "job-1", a)
    assert not jobcreds.matches(KEY, "etcd", "job-2", a)


def test_key_from_setting_dev_file_or_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 32"):
        jobcreds.load_key("short", dev_mode=True, state_dir=tmp_path)
    with pytest.raises(ValueError, match="required outside dev mode"):
        jobcreds.load_key("", dev_mode=False, state_dir=tmp_path)
    assert jobcreds.load_key("s" * 40, dev_mode=False, state_dir=tmp_path) == b"s" * 40
    made = jobcreds.load_key("", dev_mode=True, state_dir=tmp_path)
    assert len(made) >= 32 and made == jobcreds.load_key("", dev_mode=True, state_dir=tmp_path)
    mode = os.stat(tmp_path / jobcreds.KEY_FILE).st_mode
    assert stat.S_IMODE(mode) == 0o600


class _Issuer:
    def __init__(self, name, grant, fail=False):
        self.name, self._grant, self._fail, self.revoked = name, grant, fail, []

    def grant(self, plan):
        return self._grant

    def revoke(self, job_id):
        self.revoked.append(job_id)
        if self._fail:
            raise RuntimeError("store away")


def test_grants_combine_and_withhold_the_service_keys():
    a = _Issuer("etcd", Grant(controller={"TF_ETCD_USER": "job-1"}, withheld=("TF_ETCD_PASSWORD",)))
    b = _Issuer("trainer", Grant(monitor={"TF_JOB_TOKEN": "t"}))
    grant = Credentials([a, b]).grant(plan=None)
    platform = {"TF_ETCD_PASSWORD": "root", "TF_SECRETS_KEY": "s", "TF_CREDENTIALS_KEY": "c", "PATH": "/bin"}
    assert grant.env_for(Role.CONTROLLER, platform) == {"PATH": "/bin", "TF_ETCD_USER": "job-1"}
    assert grant.env_for(Role.MONITOR, platform) == {"PATH": "/bin", "TF_JOB_TOKEN": "t"}
    assert set(SERVICE_KEYS) <= set(Credentials().grant(plan=None).withheld)


def test_revoke_tries_every_issuer_and_fails_when_one_did():
    a, b = _Issuer("etcd", Grant(), fail=True), _Issuer("store", Grant())
    with pytest.raises(Unavailable, match="etcd: store away"):
        Credentials([a, b]).revoke("job-1")
    assert a.revoked == ["job-1"] and b.revoked == ["job-1"]

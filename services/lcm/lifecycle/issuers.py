"""Which per-job credentials an LCM mints (lifecycle/credentials.py), from its settings."""

from __future__ import annotations

from trainforge_services.common import jobcreds
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.lifecycle.credentials import Credentials, MonitorToken
from trainforge_services.lcm.lifecycle.etcd_users import EtcdIssuer
from trainforge_services.lcm.lifecycle.gateway_issuer import GatewayIssuer


def job_credentials(settings: LcmSettings, coordinator: Coordinator) -> Credentials:
    """The monitor's token to the Trainer, always; a job user where the LCM logs in to etcd itself; the job
    gateway's token where one is configured (controllers then reach the stores only through it)."""
    if not (settings.credentials_key or settings.dev_mode or settings.etcd_user or settings.gateway_url):
        # no key to derive from: the LCM's main refuses to start so (lcm/__main__.py); a lifecycle a program
        # builds without one grants nothing
        return Credentials()
    key = jobcreds.load_key(settings.credentials_key, dev_mode=settings.dev_mode, state_dir=settings.state_dir)
    issuers = [MonitorToken(key)]
    if settings.etcd_user:
        issuers.append(EtcdIssuer(coordinator, key))
    if settings.gateway_url:
        issuers.append(GatewayIssuer(key, settings.gateway_url))
    return Credentials(issuers)

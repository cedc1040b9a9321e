"""The embedded stack's etcd logins: authentication on, a root user, and a user each for the Trainer and the LCM.

Every password is derived from the stack's credentials key
(`<state_dir>/credentials.key`, 0600, common/jobcreds.py), so nothing more is
kept on disk and each `up` makes the same ones again. `ensure` runs once etcd
answers, before any service starts: it makes what is missing and turns
authentication on (idempotently; an etcd from an older stack gets it too).
The API reaches no etcd and gets no user. etcd hashes passwords at bcrypt's
lowest cost (`--bcrypt-cost 4`): a job's user is minted in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

from trainforge_services.common import jobcreds
from trainforge_services.common.adapters import etcdauth
from trainforge_services.common.adapters.etcd import Coordinator

PURPOSE = "etcd-service"  # jobs' own passwords are the purpose "etcd" (services/lcm/lifecycle/etcd_users.py)
SERVICES = ("trainer", "lcm")


def login(state: Path, prefix: str, name: str) -> tuple[str, str]:
    """(user, password) of `name` ("root", "trainer" or "lcm") in the stack kept in `state`."""
    key = jobcreds.load_key("", dev_mode=True, state_dir=state)
    user = etcdauth.ROOT if name == etcdauth.ROOT else etcdauth.principal(prefix, name)
    return user, jobcreds.derive(key, PURPOSE, name)


def settings(state: Path, prefix: str, name: str) -> dict[str, str]:
    """The etcd_user and etcd_password settings of service `name`."""
    user, password = login(state, prefix, name)
    return {"etcd_user": user, "etcd_password": password}


def ensure(state: Path, endpoint: str, prefix: str) -> None:
    """Root, the services' users and roles, and authentication on in the etcd at `endpoint`."""
    root_password = login(state, prefix, etcdauth.ROOT)[1]
    root = Coordinator(endpoint, prefix, user=etcdauth.ROOT, password=root_password)
    try:
        enabled = root.login()
        users = []
        for name in SERVICES:
            user, password = login(state, prefix, name)
            # the LCM mints and deletes each job's user, which etcd lets only its root role do
            users.append(etcdauth.ServiceUser(user, password, (f"{root.keys.prefix}/leaders/",), root=name == "lcm"))
        etcdauth.setup(root.admin(), root_password, users, enabled=enabled)
    finally:
        root.close()

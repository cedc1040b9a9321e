"""Each job's own etcd user: minted when the job's attempt is handed to the backend, deleted when the job goes.

The user `<prefix>-job-<job>` (etcdauth.principal) has a role of the same
name that reads and writes the job's keys, `<prefix>/jobs/<job>/`, and
nothing else: every key a controller or a monitor touches is there (its
status, halt, gate, checkpoint and logship keys; the monitor's claim and
the learners it watches), and leases need no key permission. Its password is
`jobcreds.derive(key, "etcd", job)`, so a restarted LCM hands a restarted
monitor the same one. The controllers and the monitor get the job's user in
place of the LCM's own (TF_ETCD_USER / TF_ETCD_PASSWORD); deleting the user
ends its tokens at once.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from trainforge_services.common import jobcreds
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.adapters.etcdauth import principal
from trainforge_services.lcm.backends.base import AttemptPlan, Grant

PURPOSE = "etcd"
ENV_USER, ENV_PASSWORD = "TF_ETCD_USER", "TF_ETCD_PASSWORD"


class EtcdIssuer:
    """Mints and revokes job users through `coordinator`, which is logged in with etcd's root role."""

    name = "etcd"

    def __init__(self, coordinator: Coordinator, key: bytes):
        self._admin = coordinator.admin()
        self._keys = coordinator.keys
        self._key = key
        self._lock = threading.Lock()
        self._minted: set[str] = set()  # jobs whose user this issuer made (a later attempt's grant asks nothing)
        # the user and its role are made side by side: each is a round of etcd's consensus
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="etcd-users")

    def user(self, job_id: str) -> str:
        return principal(self._keys.prefix, f"job-{job_id}")

    def password(self, job_id: str) -> str:
        return jobcreds.derive(self._key, PURPOSE, job_id)

    def grant(self, plan: AttemptPlan) -> Grant:
        job = plan.job_id
        user, password = self.user(job), self.password(job)
        with self._lock:
            minted = job in self._minted
        if not minted:
            made = self._pool.submit(self._admin.ensure_user, user, password)
            self._admin.ensure_role(user, [self._keys.job(job)])
            made.result()
            self._admin.grant_role(user, user)
            with self._lock:
                self._minted.add(job)
        env = {ENV_USER: user, ENV_PASSWORD: password}
        return Grant(controller=env, monitor=env, withheld=(ENV_USER, ENV_PASSWORD))

    def revoke(self, job_id: str) -> None:
        with self._lock:
            self._minted.discard(job_id)
        self._admin.delete(self.user(job_id), self.user(job_id))

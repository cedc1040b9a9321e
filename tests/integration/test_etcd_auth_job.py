"""A job on the local backend beside an etcd with authentication on: its controllers and monitor use its own
etcd user only, and the user is gone once the job is."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.integration.sandbox_jobs import _platform
from tests.servers import wait_for
from trainforge_services.common import jobcreds
from trainforge_services.common.adapters import etcdauth
from trainforge_services.common.adapters.etcd import Coordinator
from trainforge_services.common.errors import Unauthenticated
from trainforge_services.common.settings import StoreSettings
from trainforge_services.common.states import LearnerState
from trainforge_services.lcm.backends.base import Role

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# the learner waits for the test to look at its job's processes: a file `go` in its working directory
WAITER = """
import os, time
deadline = time.monotonic() + 120
while not os.path.exists("go") and time.monotonic() < deadline:
    time.sleep(0.05)
print("went" if os.path.exists("go") else "gave up", flush=True)
"""


@pytest.fixture(params=[True, False], ids=["fork-server", "spawned"])
def auth_platform(request, etcd_auth_server, mongo_server, osmem_server, tmp_path, unique):
    prefix, root_password = f"/tf-{unique}", etcd_auth_server.extra["root_password"]
    lcm = etcdauth.ServiceUser(etcdauth.principal(prefix, "lcm"), secrets.token_urlsafe(16), root=True)
    root = Coordinator(etcd_auth_server.address, prefix, user=etcdauth.ROOT, password=root_password)
    etcdauth.setup(root.admin(), root_password, [lcm], enabled=True)
    settings = StoreSettings(
        state_dir=tmp_path / "state", dev_mode=True, etcd_endpoints=etcd_auth_server.address, etcd_prefix=prefix,
        etcd_user=lcm.user, etcd_password=lcm.password, mongo_url=mongo_server.url, mongo_db=f"tf{unique}",
        logstore_url=osmem_server.url, logstore_index=f"tf-logs-{unique}",
        objectstore_url=(tmp_path / "objects").as_uri())
    coordinator = Coordinator.of(settings)
    with _platform(settings, coordinator, tmp_path, fork_server=request.param) as p:
        yield p
    coordinator.close()
    root.close()


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def test_the_job_runs_on_its_own_etcd_user_which_is_gone_after_it(auth_platform):
    p, job = auth_platform, "etcd-user-job"
    lcm_password = p.settings.etcd_password
    key = jobcreds.load_key("", dev_mode=True, state_dir=p.state_dir)
    user, password = etcdauth.principal(p.settings.etcd_prefix, f"job-{job}"), jobcreds.derive(key, "etcd", job)
    p.deploy(job, WAITER)
    running = wait_for(lambda: (j := next((j for j in p.lifecycle.running_jobs() if j.job_id == job), None))
                       and {h.role for h in j.handles} == {Role.MONITOR, Role.CONTROLLER} and j, 60,
                       "the job's controller and monitor")
    wait_for(lambda: (d := p.status(job)) and d["state"] == LearnerState.LEARNER_RUNNING, 60, "the learner to run")
    for handle in running.handles:
        env = environ(int(handle.ref))
        assert lcm_password not in "".join(env.values()), f"the {handle.role.value} holds the LCM's etcd password"
        assert "TF_CREDENTIALS_KEY" not in env
        if not p.settings.fork_server:  # a spawned process's environ is the one it was given
            assert (env["TF_ETCD_USER"], env["TF_ETCD_PASSWORD"]) == (user, password)
    (p.workdir(job) / "go").write_text("")
    assert p.final(job)["state"] == LearnerState.LEARNER_COMPLETED, p.log(job)
    # the monitor reported the end with the job's user; the LCM removes the job, and its user with it
    wait_for(lambda: p.coordinator.get(p.coordinator.keys.monitor(job))[0] is None, 60, "the monitor to finish")
    p.lifecycle.kill(job)
    with pytest.raises(Unauthenticated, match=user):
        Coordinator(p.settings.etcd_endpoints, p.settings.etcd_prefix, user=user, password=password).login()

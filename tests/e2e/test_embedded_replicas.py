"""`trainforge up --replicas 2`: two API, Trainer and LCM processes; each elected leader SIGKILLed mid-run.

Jobs are submitted in a burst through the first API; the Trainer leader is
SIGKILLed after a third of them, the LCM leader after two thirds. The other
replicas take over (found through the leader keys in etcd), every job
completes with one deployment, and nothing of an ended job is left in
etcd, the LCM's records or the process table.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos_support import ChaosStack, assert_everything_agrees, check_history, diagnose
from tests.servers import wait_for
from trainforge_services.devstack import launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

JOBS = 12
SETTINGS = {"TF_LEASE_TTL": "4", "TF_KILL_GRACE": "3", "TF_REPORT_RETRY_SECONDS": "0.5", "TF_LEADER_TTL": "3"}
SERVICES = {"api", "api-2", "trainer", "trainer-2", "lcm", "lcm-2"}


def manifest(i: int) -> dict:
    return {"name": f"replica-{i:02d}", "framework": "custom", "learners": 1,
            "resources": {"cpus": 0.25, "memory": "128Mi"},
            "command": "python -c \"import time; time.sleep(2); print('done')\""}


def leader(chaos: ChaosStack, service: str) -> str:
    """The component name of the service's elected replica, from its leader key's holder."""
    coord = chaos.coordinator()
    try:
        value, _ = coord.get(coord.keys.leader(service))
    finally:
        coord.close()
    if not value:
        return ""
    port = int(value["holder"].rsplit(":", 1)[1])
    name = next(n for n, p in chaos.meta["ports"].items() if p == port)
    return name.replace("_", "-")


def test_each_leader_sigkilled_mid_burst_every_job_completes_once(tmp_path_factory):
    with ChaosStack.running(tmp_path_factory.mktemp("tf-replicas"), SETTINGS, replicas=2) as chaos:
        running = {s.name for s in launcher.status(chaos.state) if s.status.value == "running"}
        assert SERVICES <= running, running
        first_trainer = wait_for(lambda: leader(chaos, "trainer"), 30, "a Trainer leader")
        first_lcm = wait_for(lambda: leader(chaos, "lcm"), 30, "an LCM leader")
        ids: dict[int, str] = {}
        for i in range(JOBS):
            if i == JOBS // 3:
                chaos.sigkill(first_trainer)
            if i == 2 * JOBS // 3:
                chaos.sigkill(first_lcm)
            ids[i] = chaos.call(chaos.client.submit, manifest(i), idempotency_key=f"replica-{i}")["id"]
        killed = time.monotonic()
        wait_for(lambda: leader(chaos, "lcm") not in ("", first_lcm), 30, "another LCM leader")
        wait_for(lambda: leader(chaos, "trainer") not in ("", first_trainer), 30, "another Trainer leader")
        took = time.monotonic() - killed

        def ended() -> dict[str, dict] | None:
            jobs = chaos.jobs()
            mine = {jid: jobs[jid] for jid in ids.values() if jid in jobs}
            done = len(mine) == JOBS and all(j["state"] in ("completed", "failed", "cancelled") for j in mine.values())
            return mine if done else None

        try:
            jobs = wait_for(ended, 240, f"{JOBS} jobs to end", interval=1.0)
        except TimeoutError:
            raise AssertionError(diagnose(chaos.state, ids.values())) from None
        for job in jobs.values():
            assert job["state"] == "completed", (job["id"], job["reason"])
            check_history(job)
        assert_everything_agrees(chaos, set(ids.values()))
        print(f"both leaders replaced within {took:.1f}s of the last submit")

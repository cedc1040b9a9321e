"""etcd SIGKILLed mid-run and started again (same data directory, same port): nothing is lost.

While etcd is down the controllers cannot renew their leases, the job
monitors' watches break and a deploy cannot write the `attempt` key. After
the restart etcd restores the leases (with a fresh TTL), the monitors reopen
their watches from the last revision they saw (or re-list), and the jobs
run to COMPLETED as if nothing had happened, including those submitted
while etcd was down.
"""

from __future__ import annotations

import time

import pytest

from tests.chaos_support import TERMINAL, ChaosStack, ProcessWatch, assert_everything_agrees, check_history
from tests.servers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SETTINGS = {"TF_LEASE_TTL": "5", "TF_KILL_GRACE": "3", "TF_REPORT_RETRY_SECONDS": "0.5"}
OUTAGE = 8.0  # seconds etcd stays down: longer than a learner's lease


def sleeper(name: str, seconds: float, learners: int) -> dict:
    return {"name": name, "framework": "custom", "learners": learners, "resources": {"cpus": 0.25, "memory": "128Mi"},
            "command": f"python -c \"import time; time.sleep({seconds}); print('done')\""}


@pytest.fixture(scope="module")
def chaos(tmp_path_factory):
    with ChaosStack.running(tmp_path_factory.mktemp("tf-etcd"), SETTINGS) as c:
        yield c


def test_an_etcd_restart_mid_run_loses_no_job_and_no_state_change(chaos):
    client = chaos.client
    with ProcessWatch(chaos.stack_id, jobs=chaos.jobs_of_own_client()) as watch:
        before = {chaos.call(client.submit, sleeper(f"etcd-{i}", 8.0, 1 + i % 2))["id"] for i in range(6)}

        def running() -> int:
            return sum(j["state"] == "running" for i, j in chaos.jobs().items() if i in before)

        wait_for(lambda: running() >= 3, 120, "some jobs to run", interval=0.5)
        chaos.sigkill("etcd")
        outage = time.monotonic()
        # submitted while etcd is down: their deploys cannot write the `attempt` key yet
        after = {chaos.call(client.submit, sleeper(f"late-{i}", 2.0, 1))["id"] for i in range(2)}
        ids = before | after
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - outage)))  # an outage of a given length
        chaos.up()  # etcd again, same data directory and port
        try:
            jobs = wait_for(lambda: (js := {i: j for i, j in chaos.jobs().items() if i in ids})
                            and all(j["state"] in TERMINAL for j in js.values()) and js, 180, "the jobs to end",
                            interval=1.0)
        except TimeoutError:
            stuck = {i: (j["state"], j["reason"][:160]) for i, j in chaos.jobs().items()
                     if i in ids and j["state"] not in TERMINAL}
            raise AssertionError(f"jobs that did not end after the etcd restart: {stuck}") from None
    assert {i: j["state"] for i, j in jobs.items()} == dict.fromkeys(ids, "completed"), \
        {j["name"]: (j["state"], j["reason"][:200]) for j in jobs.values()}
    for job in jobs.values():
        check_history(job)
        assert job["restarts"] == 0 and job["attempt"] == 1, (job["name"], job["history"])
    assert not watch.overlaps and not watch.duplicates and not watch.late, (watch.overlaps, watch.duplicates,
                                                                            watch.late)
    assert_everything_agrees(chaos, ids)
    # etcd came back with its data: the stack's key is still there, the same port answers
    coord = chaos.coordinator()
    try:
        assert coord.healthy()
    finally:
        coord.close()
    print(f"\n{len(ids)} jobs completed across an etcd outage of {OUTAGE:g}s")

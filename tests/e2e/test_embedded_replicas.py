"""`trainforge up --replicas 2`: two API, Trainer and LCM processes; each elected leader SIGKILLed mid-run.

Jobs are submitted in a burst through the first API; the Trainer leader is
SIGKILLed after a third of them, the LCM leader after two thirds. The other
replicas take over (found through the leader keys in etcd), every job
completes with one deployment, and nothing of an ended job is left in
etcd, the LCM's records or the process table.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

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


BURST = 200
SIM_SETTINGS = {**SETTINGS, "TF_BACKEND": "simulated", "TF_SIM_SECONDS": "8", "TF_SIM_MAX_LEARNERS": "60"}


def test_a_200_job_burst_survives_each_leader_sigkilled_on_the_simulated_backend(tmp_path_factory):
    """The same at the issue's scale: 200 jobs submitted at once from 8 threads through the real API,
    Trainers, LCMs, store and etcd; the simulated backend (no process per job) lets one machine hold them.
    The Trainer leader is SIGKILLed after a third of the submits, the LCM leader after two thirds. Every job
    completes with one deployment, and every attempt was launched once across both LCMs (the backend's
    launch log); the attempts the dead LCM had launched were adopted and played to their end."""
    state = tmp_path_factory.mktemp("tf-replicas-sim")
    with ChaosStack.running(state, SIM_SETTINGS, replicas=2) as chaos:
        first_trainer = wait_for(lambda: leader(chaos, "trainer"), 30, "a Trainer leader")
        first_lcm = wait_for(lambda: leader(chaos, "lcm"), 30, "an LCM leader")
        submitted: dict[int, str] = {}
        lock = threading.Lock()
        clients = [chaos.new_client() for _ in range(8)]

        def submit(i: int) -> None:
            job = chaos.call(clients[i % len(clients)].submit, manifest(i), idempotency_key=f"burst-{i}")
            with lock:
                submitted[i] = job["id"]
                done = len(submitted)
            if done == BURST // 3:
                chaos.sigkill(first_trainer)
            elif done == 2 * BURST // 3:
                chaos.sigkill(first_lcm)

        try:
            with ThreadPoolExecutor(len(clients)) as pool:
                list(pool.map(submit, range(BURST)))
        finally:
            for client in clients:
                client.close()
        assert {name for _, name, _ in chaos.kills} == {first_trainer, first_lcm}
        wait_for(lambda: leader(chaos, "lcm") not in ("", first_lcm), 30, "another LCM leader")
        wait_for(lambda: leader(chaos, "trainer") not in ("", first_trainer), 30, "another Trainer leader")
        ids = set(submitted.values())
        assert len(ids) == BURST

        def ended() -> dict[str, dict] | None:
            jobs = chaos.jobs()
            mine = {jid: jobs[jid] for jid in ids if jid in jobs}
            done = len(mine) == BURST and all(j["state"] in ("completed", "failed", "cancelled") for j in mine.values())
            return mine if done else None

        try:
            jobs = wait_for(ended, 240, f"{BURST} jobs to end", interval=1.0)
        except TimeoutError:
            late = [jid for jid, j in chaos.jobs().items() if jid in ids and j["state"] != "completed"]
            raise AssertionError(diagnose(chaos.state, late[:5])) from None
        for job in jobs.values():
            assert job["state"] == "completed", (job["id"], job["reason"])
            check_history(job)
        launches = Counter(tuple(line.split()) for line in
                           (state / "work" / "simulated-launches.log").read_text().splitlines())
        assert {job_id for job_id, _ in launches} == ids
        twice = {k: n for k, n in launches.items() if n > 1}
        assert not twice, f"attempts launched more than once: {twice}"
        assert "adopted the simulated attempt" in chaos.log(leader(chaos, "lcm")), \
            "the new LCM leader adopted none of the dead one's attempts (killed too early or too late?)"
        assert_everything_agrees(chaos, ids)

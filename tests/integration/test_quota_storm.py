"""A storm of concurrent submissions never overshoots a team's quota or the backend, loses or doubles a job.

500 jobs of random sizes from 3 teams with different quotas are submitted
by 32 threads through the Trainer's gRPC server (in-process, real
MongoDB-wire server, fake LCM), 50 of them twice at once with the same
idempotency key. A driver thread plays the job monitor: it walks each
deployed job through RUNNING, STORING and COMPLETED at its own random pace,
so the queue keeps moving until everything has run. Afterwards every job's
status history is replayed in time order: at every instant the jobs holding
resources (DEPLOYING .. STORING) must fit their team's quota and the
backend's capacity.

Why the replay is sound: a job's history timestamp is taken before its
transition commits, and a dispatch pass reads the ACTIVE jobs after the
commits it builds on, so a release always sorts before the dispatch it made
room for (ties, from the store's timestamp precision, count the release
first).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.test_quota_admission import Teams, manifest, running_fake_lcm, running_trainer
from tests.servers import wait_for
from trainforge_services.common import states
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.common.states import JobState
from trainforge_services.trainer.admission import demand
from trainforge_services.trainer.resources import Usage

GI = 2**30
JOBS = 500
RETRIES = 50
EPS = 1e-9
CAPACITY = {"gpus": 12, "cpus": 24, "memory": 96 * GI, "max_learners": 20}
QUOTAS = {
    "alpha": {"gpus": 6, "cpus": 8, "memory": 24 * GI, "jobs": 4, "gpus_by_type": {"a100": 3}},
    "beta": {"gpus": 4, "cpus": 6, "jobs": 3},
    "gamma": {"cpus": 10, "memory": 32 * GI},
}
LIMITS = ("gpus", "cpus", "memory", "jobs", "a100")
MAIN_LINE = (JobState.RUNNING, JobState.STORING, JobState.COMPLETED)


def random_job(rng: random.Random, team: str) -> dict:
    """Sizes vary widely, but every job fits its team's whole quota and the backend (else it is refused)."""
    quota = {**{k: float("inf") for k in ("gpus", "cpus", "memory")}, **QUOTAS[team]}
    while True:
        learners = rng.choice([1, 1, 2])
        gpus = rng.choice([0, 0, 1, 2])
        spec = {"learners": learners, "gpus": gpus, "cpus": rng.choice([0.5, 1, 2]),
                "memory": f"{rng.choice([1, 2, 4])}Gi",
                "gpu_type": "a100" if team == "alpha" and gpus and rng.random() < 0.4 else None}
        need = demand(parse_manifest(manifest("storm", **spec)))
        type_limit = quota.get("gpus_by_type", {}).get(spec["gpu_type"], float("inf"))
        if (need.gpus <= min(quota["gpus"], type_limit, CAPACITY["gpus"]) and need.cpus <= quota["cpus"]
                and need.memory <= quota["memory"]):
            return spec


class Monitor(threading.Thread):
    """Plays every job monitor at once: moves deployed jobs along the main line at a random pace."""

    def __init__(self, client: Teams, lcm, seed: int):  # noqa: ANN001
        super().__init__(name="storm-monitor", daemon=True)
        self.client, self.lcm, self.rng = client, lcm, random.Random(seed)
        self.completed: Counter[str] = Counter()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        progress: dict[str, int] = {}
        seen = 0
        try:
            while not self.stop.is_set():
                deployed = self.lcm.deployed()
                for job_id in deployed[seen:]:
                    progress.setdefault(job_id, 0)
                seen = len(deployed)
                for job_id in [j for j in progress if self.rng.random() < 0.6]:
                    state = MAIN_LINE[progress[job_id]]
                    self.client.report(job_id, state)
                    progress[job_id] += 1
                    if state == JobState.COMPLETED:
                        del progress[job_id]
                        self.completed[job_id] += 1
                if not progress:
                    self.stop.wait(0.005)  # idle: poll the fake LCM for the next deploys
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            self.error = e


def replay(jobs: list, check) -> dict[str, dict[str, float]]:  # noqa: ANN001
    """Walk every entry into and out of the ACTIVE states in time order; `check` sees each new total."""
    events = []
    for job in jobs:
        need = demand(parse_manifest(job.manifest_json))
        gpu_type = parse_manifest(job.manifest_json).resources.gpu_type
        for e in job.history:
            entering = e.to_state in states.ACTIVE and e.from_state not in states.ACTIVE
            leaving = e.from_state in states.ACTIVE and e.to_state not in states.ACTIVE
            if entering or leaving:
                events.append((e.timestamp, 1 if entering else 0, job.team, need, gpu_type, job.id))
    events.sort(key=lambda ev: ev[:2])
    teams: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(LIMITS, 0.0))
    backend = Usage()
    peaks: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(LIMITS, 0.0))
    for _, entering, team, need, gpu_type, job_id in events:
        sign = 1 if entering else -1
        held = teams[team]
        for resource in ("gpus", "cpus", "memory"):
            held[resource] += sign * getattr(need, resource)
        held["jobs"] += sign
        held["a100"] += sign * need.gpus if gpu_type == "a100" else 0
        backend = Usage(backend.gpus + sign * need.gpus, backend.cpus + sign * need.cpus,
                        backend.memory + sign * need.memory, backend.learners + sign * need.learners)
        if entering:
            check(job_id, team, held, backend)
            for k in LIMITS:
                peaks[team][k] = max(peaks[team][k], held[k])
    assert all(abs(v) < EPS for held in teams.values() for v in held.values()), "use left over after the end"
    return peaks


@pytest.fixture
def fake_lcm():
    with running_fake_lcm(**CAPACITY) as lcm:
        yield lcm


@pytest.fixture
def tf(mongo_server, unique, tmp_path, fake_lcm):
    with running_trainer(mongo_server, unique, tmp_path, fake_lcm) as client:
        yield client


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_storm_of_submissions_respects_quotas_at_every_instant(tf, fake_lcm):
    rng = random.Random(20240611)
    for team, quota in QUOTAS.items():
        tf.set_quota(team, **quota)
    specs = [(f"key-{i:03d}", team, random_job(rng, team))
             for i, team in enumerate(rng.choice(list(QUOTAS)) for _ in range(JOBS))]
    retried = rng.sample(specs, RETRIES)
    calls = [*specs, *retried]
    rng.shuffle(calls)
    monitor = Monitor(tf, fake_lcm, seed=7)
    monitor.start()

    def submit(call: tuple[str, str, dict]) -> tuple[str, str]:
        key, team, spec = call
        return key, tf.submit(team, key=key, **spec).id

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(submit, calls))
        submitted = time.monotonic() - started
        wait_for(lambda: monitor.error or len(monitor.completed) >= JOBS, 90, f"all {JOBS} jobs to complete")
    finally:
        monitor.stop.set()
        monitor.join(10)
    elapsed = time.monotonic() - started
    assert monitor.error is None, repr(monitor.error)

    # zero duplicates: each key has one id, retried or not
    ids_by_key: dict[str, set[str]] = defaultdict(set)
    for key, job_id in answers:
        ids_by_key[key].add(job_id)
    assert all(len(ids) == 1 for ids in ids_by_key.values()) and len(ids_by_key) == JOBS
    ids = {next(iter(ids)) for ids in ids_by_key.values()}
    assert len(ids) == JOBS

    # zero lost: every job ran once and completed exactly once
    jobs = [job for team in QUOTAS for job in tf.jobs(team)]
    assert sorted(j.id for j in jobs) == sorted(ids)
    assert sorted(fake_lcm.deployed()) == sorted(ids)
    assert set(monitor.completed) == ids and set(monitor.completed.values()) == {1}
    for job in jobs:
        assert job.state == JobState.COMPLETED, (job.id, job.reason)
        entries = Counter(e.to_state for e in job.history)
        assert entries[JobState.DEPLOYING] == 1 and entries[JobState.COMPLETED] == 1, job.id

    def check(job_id: str, team: str, held: dict[str, float], backend: Usage) -> None:
        quota = QUOTAS[team]
        for resource in ("gpus", "cpus", "memory", "jobs"):
            if resource in quota:
                assert held[resource] <= quota[resource] + EPS, f"{job_id}: team {team} over its {resource} quota"
        if "gpus_by_type" in quota:
            assert held["a100"] <= quota["gpus_by_type"]["a100"], f"{job_id}: team {team} over its a100 quota"
        assert backend.gpus <= CAPACITY["gpus"] and backend.cpus <= CAPACITY["cpus"] + EPS, job_id
        assert backend.memory <= CAPACITY["memory"] and backend.learners <= CAPACITY["max_learners"], job_id

    peaks = replay(jobs, check)
    # the quotas were actually pressed against, or the check above proves little
    for team, quota in QUOTAS.items():
        assert max(peaks[team][r] / quota[r] for r in ("gpus", "cpus", "memory", "jobs") if r in quota) >= 0.75

    # usage adds up: each team's GPU-seconds are its jobs' active spans times their GPUs
    usage = {u.team: u for u in tf.all_usage()}
    for team in QUOTAS:
        spans = sum(demand(parse_manifest(j.manifest_json)).gpus * _active_seconds(j) for j in jobs if j.team == team)
        assert usage[team].gpu_seconds == pytest.approx(spans, abs=1e-3)
        assert (usage[team].active_jobs, usage[team].queued_jobs, usage[team].in_use.gpus) == (0, 0, 0)

    # idempotent retries after the fact: the same ids, still 500 jobs
    again = rng.sample(specs, RETRIES)
    with ThreadPoolExecutor(32) as pool:
        retries = list(pool.map(submit, [*again, *again]))
    assert all(job_id in ids_by_key[key] for key, job_id in retries)
    assert sum(len(tf.jobs(team)) for team in QUOTAS) == JOBS

    print(f"\nstorm: {JOBS} jobs + {RETRIES} concurrent retries from {len(QUOTAS)} teams submitted in "
          f"{submitted:.1f}s, all completed in {elapsed:.1f}s; {len(fake_lcm.deployed())} deploys; "
          f"peaks {dict((t, {k: v for k, v in p.items() if v}) for t, p in peaks.items())}")


def _active_seconds(job) -> float:  # noqa: ANN001
    start = next(e.timestamp for e in job.history if e.to_state == JobState.DEPLOYING)
    end = next(e.timestamp for e in job.history if e.to_state == JobState.COMPLETED)
    return end - start

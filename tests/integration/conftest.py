import time
from collections.abc import Callable, Iterator

import pytest

from trainforge_services.common.states import LearnerState
from trainforge_services.lcm.lifecycle import LifecycleManager


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def put(coordinator, job: str, rank: int, state: LearnerState, attempt: int = 1, lease=None, **extra) -> None:
    """Write a learner's status value as its controller would (the wire format, fields spelled out)."""
    value = {"state": int(state), "attempt": attempt, "exit_code": None, "ts": time.time(), "message": "",
             "tail": [], "outputs_uri": "", **extra}
    coordinator.put(coordinator.keys.learner_status(job, rank), value, lease=lease)


def monitor_claimed(coordinator, job: str) -> bool:
    return coordinator.get(coordinator.keys.monitor(job))[0] is not None


@pytest.fixture
def job(unique) -> str:
    return f"job-{unique}"


def backend_maker(build: Callable[..., LifecycleManager]) -> Iterator[Callable[..., LifecycleManager]]:
    """The body of a fixture that yields `make(**kw)` (an LCM lifecycle from `build`), then kills the
    jobs every lifecycle it made still runs and closes them: `yield from backend_maker(build)`."""
    made: list[LifecycleManager] = []

    def make(*args, **kw) -> LifecycleManager:
        backend = build(*args, **kw)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        for job in backend.running_jobs():
            backend.kill(job.job_id)
        backend.close()

from collections.abc import Callable, Iterator

import pytest

from services.lcm.lifecycle import Lifecycle


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def backend_maker(build: Callable[..., Lifecycle]) -> Iterator[Callable[..., Lifecycle]]:
    """The body of a fixture that yields `make(**kw)` (an LCM lifecycle from `build`), then kills the
    jobs every lifecycle it made still runs and closes them: `yield from backend_maker(build)`."""
    made: list[Lifecycle] = []

    def make(*args, **kw) -> Lifecycle:
        backend = build(*args, **kw)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        for job in backend.running_jobs():
            backend.kill(job.job_id)
        backend.close()

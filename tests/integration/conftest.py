from collections.abc import Callable, Iterator

import pytest

from services.lcm.backends.local import LocalBackend


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def backend_maker(build: Callable[..., LocalBackend]) -> Iterator[Callable[..., LocalBackend]]:
    """The body of a fixture that yields `make(**kw)` (a LocalBackend from `build`), then kills the
    jobs every backend it made still runs and closes them: `yield from backend_maker(build)`."""
    made: list[LocalBackend] = []

    def make(*args, **kw) -> LocalBackend:
        backend = build(*args, **kw)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        for job in backend.running_jobs():
            backend.kill(job.job_id)
        backend.close()

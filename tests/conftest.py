"""Fixtures shared by every tier. Real servers are session-scoped and start lazily."""

from __future__ import annotations

import importlib.util
import uuid

import pytest

if importlib.util.find_spec("trainforge_services") is None:
    raise pytest.UsageError("the platform's packages (trainforge_services, ...) are not installed in this interpreter: "
                            "run `pip install --no-deps -e .` in the checkout (`make install` does); the repository "
                            "on PYTHONPATH does not provide their import names")

from tests import servers  # noqa: E402
from tests.kube import kube_cluster, kube_node  # noqa: F401 - the Kubernetes tier's fixtures, for every tier

# `make test` runs the suite on several workers (pytest-xdist, `-n N --dist loadgroup`); each worker starts its
# own etcd, MongoDB-wire and log store on free ports. A fixture that owns something there must be only one of
# (a dockerd on the engine cache's data roots, the control plane, chromium, folder modes for uid 65534) keeps
# every test that uses it on one worker: the fixture's name and its group. A test module that defines or imports
# one is in its group as a whole (its fixtures may ask for it at run time). Tests using two join both groups.
SHARED = {"daemon": "engine", "engine_daemon": "engine", "kube_cluster": "kube", "browser": "browser",
          "nobody_python": "nobody"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """Give each test its xdist group: its SHARED fixtures' (joined), else its module's when it uses a
    module-scoped fixture (one setup, not one per worker), else none (any worker). A test marked
    `xdist_group` keeps its own."""
    wanted = [(item, _shared_groups(item)) for item in items]
    joined: dict[str, str] = {}  # group -> a group it shares a test with (a union-find's parent)
    for _, groups in wanted:
        roots = sorted({_root(joined, g) for g in groups})
        for r in roots[1:]:
            joined[r] = roots[0]
    for item, groups in wanted:
        if item.get_closest_marker("xdist_group"):
            continue
        if groups:
            root = _root(joined, min(groups))
            item.add_marker(pytest.mark.xdist_group("-".join(sorted(
                {g for g in SHARED.values() if _root(joined, g) == root}))))
        elif _uses_module_scope(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def _shared_groups(item) -> set[str]:
    module = getattr(item, "module", None)
    names = {*item.fixturenames, *(vars(module) if module is not None else ())}
    return {SHARED[n] for n in names if n in SHARED}


def _root(joined: dict[str, str], group: str) -> str:
    while group in joined:
        group = joined[group]
    return group


def _uses_module_scope(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope in ("module", "class", "package")
                                    for defs in info.name2fixturedefs.values() for d in defs)


@pytest.fixture(scope="session")
def etcd_server():
    s = servers.start_etcd()
    yield s
    s.cleanup()


@pytest.fixture(scope="session")
def etcd_auth_server():
    """An etcd with authentication on (`extra["root_password"]`); `etcd_server` has it off, for speed and for the
    tests that reach etcd without a user."""
    s = servers.start_etcd(auth=True)
    yield s
    s.cleanup()


@pytest.fixture(scope="session")
def mongo_server():
    s = servers.start_mongo()
    yield s
    s.cleanup()


@pytest.fixture(scope="session")
def osmem_server():
    s = servers.start_osmem()
    yield s
    s.cleanup()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for names (databases, prefixes, indices) of one test."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def coordinator(etcd_server, unique):
    from trainforge_services.common.adapters.etcd import Coordinator

    c = Coordinator(etcd_server.address, prefix=f"/tf-{unique}")
    yield c
    c.close()


@pytest.fixture
def mongo_db(mongo_server, unique):
    from trainforge_services.common.adapters.mongo import connect

    db = connect(mongo_server.url, f"tf{unique}")
    yield db
    db.client.close()


@pytest.fixture
def logstore(osmem_server, unique):
    from trainforge_services.common.adapters.logstore import LogStore

    store = LogStore(osmem_server.url, index=f"tf-logs-{unique}")
    yield store
    store.close()


@pytest.fixture
def store_settings(etcd_server, mongo_server, osmem_server, tmp_path, unique):
    """StoreSettings pointing at the session's real servers, isolated per test."""
    from trainforge_services.common.settings import StoreSettings

    return StoreSettings(
        state_dir=tmp_path / "state", dev_mode=True, etcd_endpoints=etcd_server.address,
        etcd_prefix=f"/tf-{unique}", mongo_url=mongo_server.url, mongo_db=f"tf{unique}",
        logstore_url=osmem_server.url, logstore_index=f"tf-logs-{unique}",
        objectstore_url=(tmp_path / "objects").as_uri(),
    )


@pytest.fixture(scope="session")
def s3_server():
    """SeaweedFS (S3 gateway) on loopback; `extra` holds endpoint, access_key, secret_key."""
    import signal

    s = servers.start_seaweedfs()
    yield s
    s.stop(signal.SIGKILL)  # data is throwaway; a graceful SeaweedFS stop takes ~15 s
    s.cleanup()
    for sock in s.extra["sockets"]:
        sock.unlink(missing_ok=True)

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

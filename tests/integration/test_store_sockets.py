"""MongoDB and the log store as the embedded stack runs them: on a 0600 unix socket only (devstack/storesock.py).

Neither nx-27017 nor osmem-server authenticates its callers, so what keeps a learner out is that it cannot
connect: another uid is refused by the socket's mode, and the log search server's TCP port is in a network
namespace of its own. The services' adapters work through the socket.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from tests import servers
from trainforge_services.common.adapters.logstore import LogLine, LogStore
from trainforge_services.common.adapters.mongo import connect

NOBODY = 65534



@pytest.fixture(scope="module")
def mongo_sock():
    s = servers.start_mongo_socket()
    yield s
    s.cleanup()


@pytest.fixture(scope="module")
def osmem_sock():
    s = servers.start_osmem_socket()
    yield s
    s.cleanup()


def _owner_only(path) -> None:
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
    assert st.st_uid == os.getuid()


def _from_another_uid(path) -> str:
    """What connecting to `path` as another uid gives (as root: a child turned uid 65534; otherwise the mode is
    the answer, there being no other uid to try with)."""
    if os.geteuid() != 0:
        _owner_only(path)
        return "REFUSED (mode 0600; not root, so no other uid to try with)"
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, try, and say what happened by its exit status
        code = 2
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(str(path))
                    code = 0
                except PermissionError:
                    code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {0: "CONNECTED", 1: "REFUSED"}.get(os.waitstatus_to_exitcode(status), f"failed ({status})")


def test_mongo_is_reached_through_its_socket_by_the_platform_only(mongo_sock, unique):
    path = mongo_sock.extra["socket"]
    _owner_only(path)
    assert _from_another_uid(path).startswith("REFUSED"), "another uid connected to MongoDB's socket"
    db = connect(mongo_sock.url, f"tf{unique}")
    try:
        db.jobs.insert_one({"_id": "j1", "team": "a"})
        assert db.jobs.find_one({"_id": "j1"}) == {"_id": "j1", "team": "a"}
    finally:
        db.client.close()


def test_the_log_store_is_reached_through_its_socket_and_its_port_is_in_a_namespace_of_its_own(osmem_sock, unique):
    path = osmem_sock.extra["socket"]
    _owner_only(path)
    assert _from_another_uid(path).startswith("REFUSED"), "another uid connected to the log store's socket"
    pid = osmem_sock.proc.pid
    children = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    assert len(children) == 1, children  # osmem-server itself
    assert os.readlink(f"/proc/{children[0]}/ns/net") != os.readlink("/proc/self/ns/net"), \
        "osmem-server listens in this host's network namespace"
    store = LogStore(osmem_sock.url, index=f"tf-logs-{unique}")
    try:
        store.write([LogLine("job-1", "a", 0, 1, "stdout", 1, "2026-01-01T00:00:00.000Z", "hello")], refresh=True)
        page = store.read("job-1")
        assert [line["line"] for line in page.lines] == ["hello"]
    finally:
        store.close()


def test_a_stopped_store_removes_its_socket(unique):
    s = servers.start_mongo_socket()
    path = s.extra["socket"]
    assert path.exists()
    s.stop()
    assert s.proc.returncode == 0
    assert not path.exists()
    s.cleanup()

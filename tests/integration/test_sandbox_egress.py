"""Egress of sandboxed learners on the local backend: none by default; the admin's allowed destinations only.

The platform here keeps its objects in the SeaweedFS S3 server, so `store`
has an endpoint to reach. Each job tries destinations and prints `REACHED
<what>` for one it reached and `BLOCKED <what>` for one it could not; the
admin's policy is TF_EGRESS in the controllers' environment (the LCM's).
Each runs as root (`isolation: sandbox`) and with the controllers as uid
65534 (`isolation: userns`), where the relays' listening sockets come from a
helper inside the job's namespaces.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.integration.sandbox_jobs import (  # noqa: F401 - fixtures
    nobody_python,
    own_userns_platform,
    platform,
    root_platform,
    unprivileged_platform,
)
from trainforge_services.common.adapters.objectstore.s3 import S3Store
from trainforge_services.common.states import LearnerState

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BUCKET = "tf-egress"

SCRIPT = '''
import json, os, socket
ARGS = json.loads(os.environ["HOSTILE_ARGS"])
# "gateway": the first address of the learner's network (a docker attempt's bridge; rank 0 is its .2)
GATEWAY = os.environ.get("MASTER_ADDR", "127.0.0.1").rsplit(".", 1)[0] + ".1"
print("EGRESS", os.environ.get("TF_EGRESS", "?"), os.environ.get("AWS_ENDPOINT_URL", "-"), flush=True)
for what, host, port, payload in ARGS["tries"]:
    try:
        s = socket.create_connection((GATEWAY if host == "gateway" else host, port), 3)
        s.settimeout(5)
        s.sendall(payload.encode())
        got = s.recv(200).decode(errors="replace")
        s.close()
        print(f"REACHED {what}: {got[:40]!r}", flush=True)
    except Exception as e:
        print(f"BLOCKED {what}: {type(e).__name__}: {e}"[:200], flush=True)
'''


@pytest.fixture
def store_settings(store_settings, s3_server, unique):  # noqa: F811 - the conftest's, on S3
    x = s3_server.extra
    S3Store(BUCKET, "", endpoint=x["endpoint"], access_key=x["access_key"], secret_key=x["secret_key"],
            region=x["region"], create_bucket=True).close()
    return store_settings.model_copy(update={"objectstore_url": f"s3://{BUCKET}/e-{unique}",
                                             "s3_endpoint": x["endpoint"], "s3_access_key": x["access_key"],
                                             "s3_secret_key": x["secret_key"], "s3_region": x["region"]})


@pytest.fixture
def echo() -> Iterator[int]:
    """A TCP echo server on the host's loopback: the 'allowed host' of these tests."""
    yield from echo_server("127.0.0.1")


def echo_server(address: str) -> Iterator[int]:
    srv = socket.socket()
    srv.bind((address, 0))
    srv.listen(16)
    srv.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    conn.sendall(b"echo:" + conn.recv(200))
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(5)
    srv.close()


def outcomes(platform, job: str, tries: list) -> dict[str, str]:  # noqa: F811
    doc = platform.run(job, SCRIPT, env={"HOSTILE_ARGS": json.dumps({"tries": tries})})
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, platform.log(job)
    assert doc["isolation"] == platform.isolation, doc
    out = {}
    for line in doc.get("tail") or []:
        if line.startswith(("REACHED ", "BLOCKED ")):
            verdict, rest = line.split(" ", 1)
            out[rest.split(":", 1)[0]] = verdict
        if line.startswith("EGRESS "):
            out["env"] = line
    return out


def platform_ports(platform, etcd_server, mongo_server, osmem_server) -> list:  # noqa: F811
    return [["etcd", "127.0.0.1", etcd_server.port, ""], ["mongo-wire", "127.0.0.1", mongo_server.port, ""],
            ["log store", "127.0.0.1", osmem_server.port, "GET / HTTP/1.0\r\n\r\n"],
            ["api", "127.0.0.1", platform.api_port, "GET / HTTP/1.0\r\n\r\n"],
            ["trainer", "127.0.0.1", platform.trainer_port, ""]]


def test_without_a_policy_no_destination_is_reachable(platform, echo, monkeypatch, unique):  # noqa: F811
    monkeypatch.delenv("TF_EGRESS", raising=False)
    got = outcomes(platform, f"eg-none-{unique}", [
        ["echo by address", "127.0.0.1", echo, "hi"], ["echo by name", "localhost", echo, "hi"],
        ["an allowed-looking host", "pypi.internal", 443, ""], ["outside", "1.1.1.1", 443, ""]])
    assert got.pop("env").split()[1] == "none"
    assert set(got.values()) == {"BLOCKED"} and len(got) == 4, got


def allowed_only(platform, echo: int, job: str, tries: list, monkeypatch) -> None:  # noqa: F811
    """With TF_EGRESS `127.0.0.1:<echo>` the echo is reached; its neighbour port and every one of `tries` not."""
    monkeypatch.setenv("TF_EGRESS", f"127.0.0.1:{echo}")
    got = outcomes(platform, job, [["echo", "127.0.0.1", echo, "hi"],
                                   ["echo's neighbour port", "127.0.0.1", echo + 1, ""], *tries])
    assert got.pop("env").split()[1:] == [f"127.0.0.1:{echo}", "-"]
    assert got.pop("echo") == "REACHED", got
    assert set(got.values()) == {"BLOCKED"}, got


def test_an_allowed_host_port_is_reached_and_nothing_else(platform, echo, etcd_server, mongo_server,  # noqa: F811
                                                          osmem_server, s3_server, monkeypatch, unique):
    s3_port = int(s3_server.extra["endpoint"].rsplit(":", 1)[1])
    allowed_only(platform, echo, f"eg-host-{unique}", [
        ["object store", "127.0.0.1", s3_port, "GET / HTTP/1.0\r\n\r\n"],
        *platform_ports(platform, etcd_server, mongo_server, osmem_server)], monkeypatch)


def test_store_reaches_the_object_stores_endpoint_only(platform, echo, etcd_server, mongo_server,  # noqa: F811
                                                       osmem_server, s3_server, monkeypatch, unique):
    monkeypatch.setenv("TF_EGRESS", "store")
    endpoint = s3_server.extra["endpoint"]
    host, port = endpoint.split("://", 1)[1].rsplit(":", 1)
    got = outcomes(platform, f"eg-store-{unique}", [
        ["object store", host, int(port), "GET / HTTP/1.0\r\n\r\n"], ["echo", "127.0.0.1", echo, "hi"],
        *platform_ports(platform, etcd_server, mongo_server, osmem_server)])
    assert got.pop("env").split()[1:] == ["store", endpoint], "the learner is told where the store is"
    assert got.pop("object store") == "REACHED", got
    assert set(got.values()) == {"BLOCKED"}, got


def test_a_team_policy_narrows_the_admins(platform, echo, monkeypatch, unique):  # noqa: F811
    team_narrows(platform, echo, f"eg-team-{unique}", monkeypatch)


def team_narrows(platform, echo: int, job: str, monkeypatch) -> None:  # noqa: F811
    """The team's own policy (on its quota record) reaches the controller in the spec; only what both allow."""
    other = echo + 1 if echo < 65535 else echo - 1
    monkeypatch.setenv("TF_EGRESS", f"store,127.0.0.1:{echo}")
    tries = [["echo", "127.0.0.1", echo, "hi"], ["other", "127.0.0.1", other, ""]]
    doc = platform.run(job, SCRIPT, team_egress=f"127.0.0.1:{echo},127.0.0.1:{other}",
                       env={"HOSTILE_ARGS": json.dumps({"tries": tries})})
    assert doc["isolation"] == platform.isolation and doc["state"] == LearnerState.LEARNER_COMPLETED, platform.log(job)
    assert f"EGRESS 127.0.0.1:{echo} -" in doc["tail"], doc["tail"]
    assert any(ln.startswith("REACHED echo") for ln in doc["tail"]), doc["tail"]
    assert any(ln.startswith("BLOCKED other") for ln in doc["tail"]), doc["tail"]

"""The default gRPC interceptors: call statistics on both sides and x-request-id propagation.

An in-process server with the LCM's service (a stand-in servicer) on a free
port, called through `rpc.channel`, so the interceptors run exactly as
`make_server` and `channel` install them everywhere.
"""

from __future__ import annotations

import grpc
import pytest

from trainforge_protos import lcm_pb2, lcm_pb2_grpc
from trainforge_services.common import rpc
from trainforge_services.common.errors import NotFound

HEALTH = "/trainforge.v1.LifecycleManager/Health"


class Echo(lcm_pb2_grpc.LifecycleManagerServicer):
    """Health answers with the request id it was served under; HaltJob fails as told."""

    @rpc.handler
    def Health(self, request, context):  # noqa: ANN001
        return lcm_pb2.LcmHealthResponse(status=rpc.request_id())

    @rpc.handler
    def HaltJob(self, request, context):  # noqa: ANN001
        raise NotFound(f"job {request.job_id!r} not found")


@pytest.fixture
def stats():
    server_stats, client_stats = rpc.CallStats(), rpc.CallStats()
    server, port = rpc.make_server("127.0.0.1:0", max_workers=2,
                                   interceptors=[rpc.ServerInterceptor(server_stats)])
    lcm_pb2_grpc.add_LifecycleManagerServicer_to_server(Echo(), server)
    server.start()
    channel = rpc.channel(f"127.0.0.1:{port}", interceptors=[rpc.ClientInterceptor(client_stats)])
    try:
        yield lcm_pb2_grpc.LifecycleManagerStub(channel), server_stats, client_stats
    finally:
        channel.close()
        server.stop(0).wait()


def method(name: str) -> str:
    return HEALTH.replace("Health", name)


def test_calls_errors_and_latency_are_counted_per_method_on_both_sides(stats):
    stub, server_stats, client_stats = stats
    for _ in range(3):
        rpc.call(stub.Health, lcm_pb2.LcmHealthRequest())
    with pytest.raises(NotFound, match="'j1' not found"):
        rpc.call(stub.HaltJob, lcm_pb2.LcmHaltJobRequest(job_id="j1", attempt=1))
    for side in (server_stats, client_stats):
        health, halt = side.get(HEALTH), side.get(method("HaltJob"))
        assert (health.calls, dict(health.errors)) == (3, {})
        assert (halt.calls, dict(halt.errors)) == (1, {"NOT_FOUND": 1})
        assert 0 < health.max_seconds and health.mean_seconds <= health.max_seconds
        assert set(side.snapshot()) == {HEALTH, method("HaltJob")}
    assert server_stats.get(method("KillJob")).calls == 0


def test_a_client_adds_a_request_id_and_keeps_one_the_caller_set(stats):
    stub, _, _ = stats
    first = rpc.call(stub.Health, lcm_pb2.LcmHealthRequest()).status
    second = rpc.call(stub.Health, lcm_pb2.LcmHealthRequest()).status
    assert first and second and first != second  # one per call
    given = stub.Health(lcm_pb2.LcmHealthRequest(), metadata=[(rpc.REQUEST_ID, "req-42")], timeout=10)
    assert given.status == "req-42"
    assert rpc.request_id() == ""  # only inside a call


def test_a_future_call_is_counted_when_it_completes(stats):
    stub, _, client_stats = stats
    future = stub.HaltJob.future(lcm_pb2.LcmHaltJobRequest(job_id="j2"), timeout=10)
    with pytest.raises(grpc.RpcError):
        future.result()
    # the done-callback has run once result() returns
    assert dict(client_stats.get(method("HaltJob")).errors) == {"NOT_FOUND": 1}


def test_the_default_registries_are_installed_by_make_server_and_channel():
    server, port = rpc.make_server("127.0.0.1:0", max_workers=2)
    lcm_pb2_grpc.add_LifecycleManagerServicer_to_server(Echo(), server)
    server.start()
    channel = rpc.channel(f"127.0.0.1:{port}")
    before = rpc.SERVER_STATS.get(HEALTH).calls, rpc.CLIENT_STATS.get(HEALTH).calls
    try:
        rpc.call(lcm_pb2_grpc.LifecycleManagerStub(channel).Health, lcm_pb2.LcmHealthRequest())
    finally:
        channel.close()
        server.stop(0).wait()
    assert (rpc.SERVER_STATS.get(HEALTH).calls, rpc.CLIENT_STATS.get(HEALTH).calls) == \
        (before[0] + 1, before[1] + 1)


def test_call_stats_add_up_and_reset():
    stats = rpc.CallStats()
    stats.record("/m", grpc.StatusCode.UNAVAILABLE, 0.5)
    stats.record("/m", grpc.StatusCode.OK, 1.5)
    got = stats.get("/m")
    assert (got.calls, dict(got.errors), got.mean_seconds, got.max_seconds) == (2, {"UNAVAILABLE": 1}, 1.0, 1.5)
    stats.reset()
    assert stats.snapshot() == {}


def test_a_server_logs_the_request_id_and_hands_it_on_to_the_calls_it_makes(stats, caplog):
    inner, _, _ = stats

    class Relay(lcm_pb2_grpc.LifecycleManagerServicer):
        @rpc.handler
        def Health(self, request, context):  # noqa: ANN001
            return rpc.call(inner.Health, lcm_pb2.LcmHealthRequest())  # a call made while serving one

    server, port = rpc.make_server("127.0.0.1:0", max_workers=2, interceptors=[rpc.ServerInterceptor()])
    lcm_pb2_grpc.add_LifecycleManagerServicer_to_server(Relay(), server)
    server.start()
    channel = rpc.channel(f"127.0.0.1:{port}")
    try:
        with caplog.at_level("DEBUG", logger="trainforge_services.common.rpc"):
            relayed = lcm_pb2_grpc.LifecycleManagerStub(channel).Health(
                lcm_pb2.LcmHealthRequest(), metadata=[(rpc.REQUEST_ID, "req-7")], timeout=10)
    finally:
        channel.close()
        server.stop(0).wait()
    assert relayed.status == "req-7"  # the inner server saw the outer call's id
    assert f"{HEALTH} [req-7] OK" in caplog.text

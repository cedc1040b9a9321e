"""The SDK through failures: what is retried, what is not, and following a job across an API restart."""

from __future__ import annotations

import threading

import httpx
import pytest
import uvicorn

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.servers import free_port, wait_for
from trainforge import sdk
from trainforge.sdk import ApiError, Client
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.common.adapters.logstore import LogLine
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings
from trainforge_services.common.states import JobState

JOB = {"id": "j-1", "state": "queued"}
UNAVAILABLE = {"error": {"code": "unavailable", "message": "job store unavailable; retry shortly", "details": []}}


@pytest.fixture
def no_sleep(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(sdk.time, "sleep", waits.append)
    return waits


def scripted(answers: list):
    """A transport answering each request with the next item: a status code, or an exception to raise."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0) if answers else 200
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer, json=JOB if answer < 400 else UNAVAILABLE)

    return httpx.MockTransport(handler), seen


def test_reads_are_retried_on_connection_errors_and_5xx(no_sleep):
    transport, seen = scripted([httpx.ConnectError("refused"), 503, httpx.ReadTimeout("slow"), 200])
    assert Client("http://api.invalid", "k", transport=transport).get("j-1") == JOB
    assert len(seen) == 4 and len(no_sleep) == 3


def test_a_change_is_retried_only_when_it_never_reached_the_server(no_sleep):
    transport, seen = scripted([httpx.ConnectError("refused"), 200])
    assert Client("http://api.invalid", "k", transport=transport).cancel("j-1") == JOB
    assert len(seen) == 2
    transport, seen = scripted([503, 200])
    with pytest.raises(ApiError) as e:
        Client("http://api.invalid", "k", transport=transport).cancel("j-1")
    assert e.value.status == 503 and "retry shortly" in str(e.value) and len(seen) == 1


def test_submit_is_retried_after_a_5xx_only_with_an_idempotency_key(no_sleep, tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    manifest = {"name": "s", "command": "python train.py"}
    transport, seen = scripted([502, 200])
    with pytest.raises(ApiError):
        Client("http://api.invalid", "k", transport=transport).submit(manifest, code_dir=tmp_path)
    assert len(seen) == 1
    transport, seen = scripted([502, 504, 200])
    Client("http://api.invalid", "k", transport=transport).submit(manifest, code_dir=tmp_path, idempotency_key="x")
    # The same body each time, but for the multipart boundary: the archive was rewound before every attempt.
    bodies = [r.read().replace(r.headers["content-type"].split("boundary=")[1].encode(), b"B") for r in seen]
    assert len(bodies) == 3 and bodies[0] == bodies[1] == bodies[2]
    assert all(r.headers["Idempotency-Key"] == "x" for r in seen)


def test_the_retry_budget_ends_with_the_error():
    transport, seen = scripted([httpx.ConnectError("refused")] * 1000)
    with pytest.raises(ApiError) as e:
        Client("http://api.invalid", "k", transport=transport, retry_seconds=0.3).get("j-1")
    assert e.value.status == 0 and "cannot reach" in str(e.value) and 1 < len(seen) < 10


class Api:
    """The API app on a fixed loopback port that can be stopped and started again, like a restart."""

    def __init__(self, app):
        self.app, self.port = app, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    ws="none"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 10, "the API server")

    def stop(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(10)


@pytest.fixture
def api(mongo_db, logstore, tmp_path):
    identity = IdentityStore(mongo_db)
    identity.create_team("alpha")
    key = identity.issue_key("alpha", "sdk", Role.MEMBER)
    trainer = InMemoryTrainer()
    app = create_app(ApiSettings(dev_mode=True), trainer=trainer, identity=identity, logs=logstore,
                     objects=LocalStore(tmp_path / "objects"))
    server = Api(app)
    server.start()
    failures: list[str] = []

    class Counting(httpx.HTTPTransport):
        def handle_request(self, request):
            try:
                return super().handle_request(request)
            except httpx.ConnectError:
                failures.append(request.url.path)
                raise

    client = Client(server.url, key, timeout=5, transport=Counting(), reconnect_seconds=60)
    yield server, client, trainer, logstore, failures
    client.close()
    server.stop()


def ship(logs, job_id, seqs):
    logs.write([LogLine(job_id, "alpha", 0, 1, "stdout", s, f"2030-01-01T00:00:{s:02d}.000Z", f"line {s}")
                for s in seqs], refresh=True)


@pytest.mark.parametrize("how", ["follow", "wait"])
def test_follow_and_wait_survive_an_api_restart(api, how):
    server, client, trainer, logs, failures = api
    job = client.submit({"name": "restart", "command": "true"})
    ship(logs, job["id"], range(1, 4))
    got: list[int] = []

    def restart():
        if how == "follow":
            wait_for(lambda: len(got) >= 3, 20, "the first lines")
        server.stop()
        wait_for(lambda: failures, 20, "the client to find the API gone")
        ship(logs, job["id"], range(4, 6))  # shipped while the API was down
        for state in (JobState.DEPLOYING, JobState.RUNNING, JobState.FAILED):
            trainer.report(job["id"], state, f"now {state.name.lower()}")
        server.start()

    t = threading.Thread(target=restart)
    t.start()
    if how == "follow":
        states: list[str] = []
        got.extend(line["seq"] for line in client.follow_logs(job["id"], poll_interval=0.05, on_state=states.append))
        assert got == [1, 2, 3, 4, 5] and states[-1] == "failed"
    else:
        assert client.wait(job["id"], poll_interval=0.05)["state"] == "failed"
    t.join(20)
    assert failures

"""The hostile-learner suite (tests/hostile/probes.py) per backend: one test per probe, each failing on its own
when the learner got what it must not have.

A job runs the probes as its command beside the real etcd, Mongo-wire, log
store and SeaweedFS (S3) servers, a Trainer and an LCM gRPC server and the
REST API, whose addresses it is handed, as a hostile user would know them.
The platform keeps its objects in S3, so its controllers hold the store's
keys, and the test process's environment (the controllers') holds a canary
credential; the state dir holds a config.json and another job's file with
the canary. Backends: the local sandbox as root (`sandbox`), without root
(`userns`) and docker (`container`). The probes run once per backend; the
results are shared by its tests. With isolation `none` the same probes must
escape (the suite is not blind), which is what the threat model says of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hostile import probes
from tests.integration.sandbox_jobs import (  # noqa: F401 - fixtures
    docker_platform,
    engine_daemon,
    nobody_python,
    root_platform,
    unprivileged_platform,
    unprivileged_unavailable,
)
from trainforge_protos import lcm_pb2_grpc
from trainforge_services.common import rpc
from trainforge_services.common.adapters.objectstore.s3 import S3Store
from trainforge_services.common.states import LearnerState
from trainforge_services.lcm.grpc_api import LcmServicer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

BUCKET = "tf-hostile"
OTHER_KEY = "jobs/other-team-job/outputs/model.bin"
SCRIPT = Path(probes.__file__).read_text()
FIXTURES = {"sandbox": "root_platform", "userns": "unprivileged_platform", "docker": "docker_platform",
            "none": "root_platform"}
ISOLATION = {"sandbox": "sandbox", "userns": "userns", "docker": "container", "none": "none"}
RESULTS: dict[str, dict[str, dict]] = {}  # backend -> probe -> its line, once per module run


@pytest.fixture
def store_settings(store_settings, s3_server, unique):  # noqa: F811 - the conftest's, on S3
    x = s3_server.extra
    store = S3Store(BUCKET, "", endpoint=x["endpoint"], access_key=x["access_key"], secret_key=x["secret_key"],
                    region=x["region"], create_bucket=True)
    store.put_bytes(OTHER_KEY, b"another team's model")
    store.close()
    return store_settings.model_copy(update={"objectstore_url": f"s3://{BUCKET}/h-{unique}",
                                             "s3_endpoint": x["endpoint"], "s3_access_key": x["access_key"],
                                             "s3_secret_key": x["secret_key"], "s3_region": x["region"]})


def run_probes(request, backend: str) -> dict[str, dict]:
    """The probes' lines of one job on `backend`, by probe name."""
    if backend == "userns" and (why := unprivileged_unavailable()):
        pytest.skip(why)
    unique, mp = request.getfixturevalue("unique"), request.getfixturevalue("monkeypatch")
    canary = f"tfcanary-{unique}"
    # what a platform process holds beside the store's keys: the controllers inherit this environment
    mp.setenv("TF_HOSTILE_API_TOKEN", canary)
    mp.setenv("AWS_SECRET_ACCESS_KEY", canary)
    mp.delenv("TF_EGRESS", raising=False)
    if backend == "none":
        mp.setenv("TF_ISOLATION", "none")
    platform = request.getfixturevalue(FIXTURES[backend])
    etcd, mongo, osmem = (request.getfixturevalue(f) for f in ("etcd_server", "mongo_server", "osmem_server"))
    state = platform.state_dir
    victim = state / "work" / f"victim-{unique}" / "1" / "learner-0"
    victim.mkdir(parents=True)
    (victim / "secret.txt").write_text(f"victim secret {canary}")
    (state / "config.json").write_text(json.dumps({"api_key": canary}))
    mongo_files = sorted(str(p) for p in Path(mongo.data_dir).rglob("*") if p.is_file())[:1]
    lcm, lcm_port = rpc.make_server("127.0.0.1:0")
    lcm_pb2_grpc.add_LifecycleManagerServicer_to_server(LcmServicer(platform.lifecycle), lcm)
    lcm.start()
    s3 = request.getfixturevalue("s3_server").extra
    args = {"backend": "docker" if backend == "docker" else "sandbox", "canary": canary,
            "files": {"state": [str(state / "config.json"), str(victim / "secret.txt"), *mongo_files],
                      "state_dirs": [str(state), str(state / "work"), str(mongo.data_dir)],
                      # docker mounts the environment cache read-only (docs/THREAT_MODEL.md): its name is seen
                      "seen_by_design": ["envs"] if backend == "docker" else [],
                      "cli_config": [str(Path.home() / ".trainforge" / "config.json")]},
            "endpoints": {"etcd": etcd.address, "mongo": mongo.address, "logstore": osmem.url,
                          "logstore_index": platform.settings.logstore_index, "api": f"http://127.0.0.1:{platform.api_port}",
                          "trainer": f"127.0.0.1:{platform.trainer_port}", "lcm": f"127.0.0.1:{lcm_port}",
                          "s3": {"endpoint": s3["endpoint"], "bucket": BUCKET, "key": OTHER_KEY}}}
    job = f"probes-{backend}-{unique}"
    try:
        doc = platform.run(job, SCRIPT, env={"HOSTILE_ARGS": json.dumps(args)})
    finally:
        lcm.stop(0).wait()
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, platform.log(job)
    assert doc["isolation"] == ISOLATION[backend], doc
    found = {}
    for line in platform.log(job).splitlines():
        text = json.loads(line).get("line", "") if line.startswith("{") else line
        if text.startswith("PROBE "):
            result = json.loads(text.removeprefix("PROBE "))
            found[result["probe"]] = result
    assert set(found) == set(probes.applies(args["backend"])), found
    return found


def results(request, backend: str) -> dict[str, dict]:
    if backend not in RESULTS:
        RESULTS[backend] = run_probes(request, backend)
    return RESULTS[backend]


CASES = [(backend, name) for backend in ("sandbox", "userns", "docker")
         for name in probes.applies("docker" if backend == "docker" else "sandbox")]


@pytest.mark.parametrize(("backend", "probe"), CASES, ids=[f"{b}-{p}" for b, p in CASES])
def test_the_learner_cannot(request, backend, probe):
    got = results(request, backend)[probe]
    assert not got["escaped"], f"{backend}: the learner could {got['tried']}: {got['result']}"


def test_without_isolation_the_probes_escape(request):
    """isolation `none` (the local fallback): the learner reads the platform's credentials and files, reaches its
    servers and may signal its controller, as docs/THREAT_MODEL.md says; the probes see it."""
    got = results(request, "none")
    escaped = {name for name, r in got.items() if r["escaped"]}
    assert {"proc_environ", "state_directory", "etcd", "mongo", "log_store", "trainer_grpc", "lcm_grpc",
            "signal_controller"} <= escaped, got


def test_an_admin_refuses_a_job_that_would_run_without_isolation(root_platform, monkeypatch, unique):  # noqa: F811
    """TF_REQUIRE_ISOLATION=true: a learner that would get isolation `none` never runs; its status says why."""
    monkeypatch.setenv("TF_ISOLATION", "none")
    monkeypatch.setenv("TF_REQUIRE_ISOLATION", "true")
    job = f"refused-{unique}"
    doc = root_platform.run(job, SCRIPT, env={"HOSTILE_ARGS": json.dumps({"backend": "sandbox"})})
    assert doc["state"] == LearnerState.LEARNER_FAILED and doc["isolation"] == "none", doc
    assert doc["message"] == ("this platform refuses learners without a sandbox (TF_REQUIRE_ISOLATION) and "
                              "TF_ISOLATION=none")
    assert "PROBE " not in root_platform.log(job)

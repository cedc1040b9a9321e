"""The docker backend on a real Docker engine, through the whole embedded stack (`trainforge up`, API, CLI).

The engine is private to this module (tests/engine.py: dockerd from
tools/engine/setup.sh's cache, on its own socket, stopped by PID). If it
cannot be set up the module's tests FAIL with the reason; they never skip.
"""

from __future__ import annotations

import gc
import os
import re
import signal
from pathlib import Path

import psutil
import pytest

from tests.e2e.test_elastic import elastic_job, world_lines
from tests.e2e.test_embedded_stack import cli_json, run_cli, stack_processes, wait_terminal
from tests.e2e.test_halt_resume import EPOCHS, assert_bitwise_equal, example, log_text, model_of
from tests.engine import NUMPY_IMAGE, Daemon, start_engine
from tests.servers import wait_for
from tests.tenancy import published_read, refused_probes, two_teams
from trainforge_services.common.adapters.docker_engine import Engine
from trainforge_services.common.errors import ResourceExhausted, Unavailable
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.backends.docker import DockerBackend
from trainforge_services.lcm.lifecycle import JobDeployment, LifecycleManager

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def daemon():
    d = start_engine()  # raises EngineUnavailable with the reason: the tier fails, it does not skip
    yield d
    d.stop()


@pytest.fixture(scope="module")
def docker_stack(daemon: Daemon, tmp_path_factory):
    state = tmp_path_factory.mktemp("tf-docker-state")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TRAINFORGE_", "DOCKER_"))}
    env.update(TF_STATE_DIR=str(state), PYTHONUNBUFFERED="1", TF_BACKEND="docker", TF_DOCKER_URL=daemon.url)
    run_cli(env, "up", timeout=180)
    stack_id = (state / "stack.json").read_text()
    yield env, state, stack_id
    run_cli(env, "down", timeout=120, check=False)


def ours(engine: Engine, job_id: str) -> list:
    return engine.containers({"tf.job": job_id})


def write_job(tmp_path: Path, name: str, script: str, manifest: str) -> Path:
    work = tmp_path / name
    work.mkdir()
    (work / "job.py").write_text(script)
    (work / "manifest.yaml").write_text(f"name: {name}\ncode: .\n{manifest}")
    return work / "manifest.yaml"


@pytest.fixture(scope="module")
def reference(docker_stack, daemon, tmp_path_factory):
    """The example DDP job, uninterrupted, in containers: its final model (what the other runs must end with)."""
    env, state, _ = docker_stack
    job_id = cli_json(env, "submit", str(example(tmp_path_factory.mktemp("ref"), "mnist-docker")))["id"]
    found = wait_for(lambda: len(c := ours(daemon.engine, job_id)) == 2 and c, 120, "the job's two containers")
    assert {c.labels["tf.rank"] for c in found} == {"0", "1"}
    assert all(c.labels["tf.job"] == job_id and c.labels["tf.attempt"] == "1" and c.labels["tf.team"]
               for c in found)
    assert all(c.memory == 2 * 2**30 and c.nano_cpus == 10**9 for c in found)
    job = wait_terminal(env, job_id, 400)
    assert job["state"] == "completed", job
    return job_id, model_of(state, job_id)


def test_the_example_ddp_job_completes_in_containers(reference, daemon):
    job_id, model = reference
    assert model
    # the Trainer's clean-up (KillJob) of a finished job removes its network
    wait_for(lambda: ours(daemon.engine, job_id) == [] and not daemon.engine.networks({"tf.job": job_id}), 60,
             "the containers and the network to be removed")


def test_a_script_importing_a_library_only_its_image_has_runs(docker_stack, tmp_path):
    env, _, _ = docker_stack
    script = "import numpy\nprint('numpy', numpy.__version__, int(numpy.arange(5).sum()))\n"
    manifest = write_job(tmp_path, "needs-numpy", script,
                         f"image: {NUMPY_IMAGE}\ncommand: python job.py\nresources: {{cpus: 0.5, memory: 512Mi}}\n")
    job_id = cli_json(env, "submit", str(manifest))["id"]
    job = wait_terminal(env, job_id, 180)
    assert job["state"] == "completed", job
    lines = [line["line"] for line in cli_json(env, "logs", job_id)["lines"]]
    assert any(line.startswith("numpy 2.") and line.endswith(" 10") for line in lines), lines


def test_another_teams_objects_are_refused_and_a_published_prefix_is_read_in_a_container(docker_stack, tmp_path):
    env, state, _ = docker_stack
    teams = two_teams(env, tmp_path)
    refused_probes(teams, tmp_path)
    published_read(teams, state, tmp_path)


def test_a_missing_image_fails_the_job_naming_it(docker_stack, tmp_path):
    env, _, _ = docker_stack
    manifest = write_job(tmp_path, "no-image", "print(1)\n", "image: nosuch/image:1\ncommand: python job.py\n")
    job = wait_terminal(env, cli_json(env, "submit", str(manifest))["id"], 120)
    assert job["state"] == "failed" and "image nosuch/image:1 not found" in job["reason"], job


def test_a_memory_hog_is_stopped_at_its_limit_with_a_clear_reason(docker_stack, daemon, tmp_path):
    env, _, _ = docker_stack
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 2**20))\n"
    manifest = write_job(tmp_path, "memory-hog", hog, "command: python job.py\nresources: {memory: 256Mi}\n")
    job_id = cli_json(env, "submit", str(manifest))["id"]
    job = wait_terminal(env, job_id, 180)
    assert job["state"] == "failed", job
    assert "OOM-killed" in job["reason"] and "memory limit of 256Mi" in job["reason"], job
    assert ours(daemon.engine, job_id) == []


def test_halt_then_resume_ends_with_the_model_of_an_uninterrupted_run(docker_stack, daemon, reference, tmp_path):
    env, state, _ = docker_stack
    job_id = cli_json(env, "submit", str(example(tmp_path, "mnist-halted")))["id"]
    wait_for(lambda: f"epoch 1/{EPOCHS}" in log_text(env, job_id), 240, "the first epoch to end", interval=1.0)
    halted = cli_json(env, "halt", job_id, timeout=180)
    assert halted["state"] == "halted", halted
    assert halted["checkpoint_step"] is not None and halted["checkpoint_step"] > 0
    wait_for(lambda: ours(daemon.engine, job_id) == [], 30, "the containers to be gone")
    assert cli_json(env, "resume", job_id)["attempt"] == 2
    job = wait_terminal(env, job_id, 300)
    assert job["state"] == "completed", job
    assert f"resuming from step {halted['checkpoint_step']}" in log_text(env, job_id)
    assert_bitwise_equal(model_of(state, job_id), reference[1])


def test_a_learner_container_killed_with_sigkill_restarts_from_its_checkpoint(docker_stack, daemon, reference,
                                                                             tmp_path):
    env, state, _ = docker_stack
    job_id = cli_json(env, "submit", str(example(tmp_path, "mnist-sigkill", interval="2s")))["id"]
    wait_for(lambda: f"epoch 1/{EPOCHS}" in log_text(env, job_id), 240, "the first epoch to end", interval=1.0)
    victim = next(c for c in ours(daemon.engine, job_id) if c.labels["tf.rank"] == "1")
    assert daemon.engine.signal(victim.id, "SIGKILL")
    job = wait_terminal(env, job_id, 300)
    assert job["state"] == "completed", job
    assert job["restarts"] == 1
    restart = next(h for h in job["history"] if h["to"] == "restarting")
    assert "killed by SIGKILL" in restart["reason"], restart
    assert "resuming from step" in log_text(env, job_id)
    assert_bitwise_equal(model_of(state, job_id), reference[1])


def test_an_lcm_killed_during_a_run_adopts_its_containers(docker_stack, daemon, tmp_path):
    env, _, stack_id = docker_stack
    job_id = cli_json(env, "submit", str(example(tmp_path, "mnist-adopt")))["id"]
    before = wait_for(lambda: len(c := ours(daemon.engine, job_id)) == 2 and c, 120, "two containers")
    lcm = next(p for p in stack_processes(stack_id.strip() and _stack_id(stack_id))
               if "trainforge_services.lcm" in " ".join(p.cmdline()))
    lcm.send_signal(signal.SIGKILL)
    psutil.wait_procs([lcm], 10)
    run_cli(env, "up", timeout=180)  # starts what is missing: a new LCM on the same state
    job = wait_terminal(env, job_id, 500)
    assert job["state"] == "completed", job
    assert job["attempt"] == 1, "the job was redeployed instead of adopted"
    assert {c.id for c in before} and ours(daemon.engine, job_id) == []


def test_cancel_then_down_leave_no_container_or_network_behind(docker_stack, daemon, tmp_path):
    env, _, stack_id = docker_stack
    cancelled = cli_json(env, "submit", str(example(tmp_path / "c", "mnist-cancel")))["id"]
    wait_for(lambda: len(ours(daemon.engine, cancelled)) == 2, 120, "two containers")
    run_cli(env, "cancel", cancelled)
    wait_for(lambda: ours(daemon.engine, cancelled) == [] and not daemon.engine.networks({"tf.job": cancelled}),
             60, "the cancelled job's containers and network to be removed")
    job_id = cli_json(env, "submit", str(example(tmp_path, "mnist-down")))["id"]
    wait_for(lambda: len(ours(daemon.engine, job_id)) == 2, 120, "two containers")
    run_cli(env, "down", timeout=120)
    sid = _stack_id(stack_id)
    assert daemon.engine.containers({"tf.stack": sid}) == []
    assert daemon.engine.networks({"tf.stack": sid}) == []
    assert daemon.engine.volumes({}) == []
    run_cli(env, "up", timeout=180)


def _stack_id(stack_json: str) -> str:
    import json

    return json.loads(stack_json)["stack_id"]


@pytest.fixture
def docker_lifecycle(tmp_path, etcd_server, coordinator):
    made = []

    def make(url: str) -> LifecycleManager:
        settings = LcmSettings(backend="docker", state_dir=tmp_path / "state", etcd_endpoints=etcd_server.address,
                               etcd_prefix=coordinator.keys.prefix, trainer_address="127.0.0.1:1", docker_url=url)
        lcm = LifecycleManager.from_settings(settings, DockerBackend(settings), coordinator, supervise_interval=600)
        made.append(lcm)
        return lcm

    yield make
    for lcm in made:
        lcm.close()


def mnist_deployment(job_id: str, **resources) -> JobDeployment:
    manifest = Manifest(name="m", learners=2, command="python train.py", resources=resources)
    return JobDeployment(job_id=job_id, team="team-a", attempt=1, manifest=manifest)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_an_unreachable_engine_makes_the_deploy_unavailable_and_leaves_nothing(docker_lifecycle, tmp_path, unique):
    lcm = docker_lifecycle(f"unix://{tmp_path}/gone.sock")
    # Unavailable: the Trainer keeps the job DEPLOYING and deploys again (it is not lost)
    with pytest.raises(Unavailable, match=r"docker engine at unix://.*gone.sock is unreachable"):
        lcm.deploy(mnist_deployment(f"j-{unique}"))
    assert lcm.running_jobs() == []
    assert not (tmp_path / "state" / "lcm" / "jobs" / f"j-{unique}.json").exists()
    gc.collect()  # the SDK leaves a failed connection's socket to the collector: collect it here


def test_capacity_is_the_engines_and_a_job_beyond_what_is_free_is_refused(docker_lifecycle, daemon, unique):
    lcm = docker_lifecycle(daemon.url)
    info = daemon.engine.info()
    cap = lcm.capacity()
    assert (cap.backend, cap.cpus, cap.memory, cap.gpus) == ("docker", float(info.cpus), info.memory, 0)
    assert lcm.backend.free() == (info.cpus, info.memory), "nothing of this stack runs"
    with pytest.raises(ResourceExhausted, match="bytes of memory; the docker engine has .* free"):
        lcm.deploy(mnist_deployment(f"j-{unique}", memory=info.memory // 2 + 2**30))
    with pytest.raises(ResourceExhausted, match=r"needs 400 CPU\(s\)"):
        lcm.deploy(mnist_deployment(f"k-{unique}", cpus=200))
    assert daemon.engine.networks({"tf.job": f"j-{unique}"}) == []



def elastic_manifest(tmp_path: Path) -> Path:
    """examples/elastic at `learners: {min: 2, max: 3}`, half a CPU each (three fit the engine's two CPUs)."""
    path = elastic_job(tmp_path)
    text = path.read_text().replace("learners: {min: 1, max: 2}", "learners: {min: 2, max: 3}")
    path.write_text(text.replace("resources: {cpus: 1, memory: 1Gi}", "resources: {cpus: 0.5, memory: 1Gi}"))
    return path


def started(env, job_id: str, world: int) -> list[int]:
    """The steps rank 0 of a group of `world` started at, in log order."""
    return [int(m.group(1)) for ln in world_lines(env, job_id)
            if (m := re.match(rf"world {world}: rank 0 starts at step (\d+)", ln))]


@pytest.mark.timeout(600)
def test_an_elastic_job_grows_shrinks_when_a_container_is_killed_and_grows_back(docker_stack, daemon, tmp_path):
    """An elastic job in containers, torchrun's c10d rendezvous across the job's network: it starts at its
    minimum (slots 0 and 1), the Trainer's grant adds slot 2, `docker kill` of slot 2's container shrinks the
    group to 2 instead of failing the job, the LCM starts slot 2 again and the job completes at 3."""
    env, state, _ = docker_stack
    # growth is granted only while no job waits: let what earlier tests of this module left (a job restarting
    # after its LCM was killed, say) end first
    wait_for(lambda: all(j["state"] in ("completed", "failed", "cancelled", "halted") for j in cli_json(env, "status")), 300,
             "the earlier tests' jobs to end", interval=1.0)
    job_id = cli_json(env, "submit", str(elastic_manifest(tmp_path)))["id"]
    first = wait_for(lambda: len(c := ours(daemon.engine, job_id)) >= 2 and c, 120, "the job's first containers")
    assert {c.labels["tf.rank"] for c in first} >= {"0", "1"}
    wait_for(lambda: {c.labels["tf.rank"] for c in ours(daemon.engine, job_id)} == {"0", "1", "2"}, 120,
             "the granted third container")
    wait_for(lambda: any(ln.startswith("world 3: rank 0 saved") for ln in world_lines(env, job_id)), 300,
             "the job to train with 3 learners", interval=1.0)
    shrunk_before = len(started(env, job_id, 2))
    victim = next(c for c in ours(daemon.engine, job_id) if c.labels["tf.rank"] == "2")
    assert daemon.engine.signal(victim.id, "SIGKILL")
    wait_for(lambda: len(started(env, job_id, 2)) > shrunk_before, 180, "the job to run on with 2 learners",
             interval=1.0)
    grown_before = len(started(env, job_id, 3))
    wait_for(lambda: len(s := started(env, job_id, 3)) > grown_before and s[-1] > 0, 240,
             "the job to grow back to 3 learners from its checkpoint", interval=1.0)
    job = wait_terminal(env, job_id, 300)
    assert job["state"] == "completed", job["reason"]
    assert job["world_size"] == {"current": 3, "target": 3, "min": 2, "max": 3}
    lines = world_lines(env, job_id)
    assert not any(re.match(r"world 1:", ln) for ln in lines), "never below the minimum"
    assert any(ln.startswith("world 3: rank 0 done at step 400") for ln in lines), lines
    models = sorted((state / "objects" / "jobs" / job_id / "outputs").glob("*/model.pt"))
    assert len(models) == 1, models
    # the LCM deployed the minimum, then started slot 2 on the grant and again after the kill
    lcm_log = "".join(p.read_text(errors="replace") for p in (state / "logs").glob("lcm*.log"))
    assert f"job {job_id} attempt 1: granted 3 learner(s)" in lcm_log
    assert lcm_log.count(f"job {job_id} attempt 1: starting learner(s) 2 (2 running, at most 3)") >= 2, lcm_log[-3000:]
    wait_for(lambda: ours(daemon.engine, job_id) == [], 60, "the job's containers to be removed")

"""The docker backend's decisions about containers, without an engine: addresses, labels, limits, GPUs, env."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainforge_services.common.adapters.docker_engine import (
    ContainerRequest,
    device_requests,
    host_config,
    label_filter,
)
from trainforge_services.common.errors import ResourceExhausted
from trainforge_services.common.isolation import job_uid
from trainforge_services.common.manifest import Manifest
from trainforge_services.lcm.backends.base import Site
from trainforge_services.lcm.backends.docker import containers
from trainforge_services.lcm.backends.docker.runner import (
    container_env,
    container_user,
    egress_gate,
    host_addresses,
    human_bytes,
)
from trainforge_services.lcm.lifecycle import JobDeployment, build_plan


def plan_for(tmp_path: Path, gpus: int = 0, learners: int = 2):
    manifest = Manifest(name="m", learners=learners, command="python train.py", image="team/img:1",
                        resources={"gpus": gpus, "cpus": 1.5, "memory": "512Mi"})
    job = JobDeployment(job_id="j-abc", team="team-a", attempt=3, manifest=manifest)
    subnet = containers.pick_subnet("j-abc", 3, set())
    site = Site(attempt_dir=tmp_path / "j-abc" / "3", master_addr=containers.rank_address(subnet, 0),
                master_port=containers.MASTER_PORT)
    return build_plan(job, site, list(range(gpus * learners)), lease_ttl=10, start_timeout=30), subnet


def test_subnets_are_24s_of_the_pool_that_skip_the_used_ones():
    first = containers.pick_subnet("j-1", 1, set())
    assert first.prefixlen == 24 and first.subnet_of(ipaddress.ip_network("10.213.0.0/16"))
    assert containers.pick_subnet("j-1", 1, set()) == first, "the same attempt hashes to the same start"
    other = containers.pick_subnet("j-1", 1, {str(first), "172.17.0.0/16"})
    assert other != first
    every = {str(n) for n in ipaddress.ip_network("10.213.0.0/16").subnets(new_prefix=24)}
    with pytest.raises(ResourceExhausted, match="no free /24"):
        containers.pick_subnet("j-1", 1, every)


def test_a_learners_container_plan_has_its_address_labels_limits_and_mounts(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_STACK_ID", "stack-9")
    plan, subnet = plan_for(tmp_path, gpus=1)
    spec = plan.learners[1]
    box = containers.container_plan(plan, spec, engine_url="unix:///x.sock", image="team/img:1",
                                    stack=containers.stack_label(), python=sys.executable)
    assert plan.master_addr == str(subnet.network_address + 2) and box.ip == str(subnet.network_address + 3)
    assert spec.master_addr == plan.master_addr, "the DDP rendezvous is rank 0's container"
    assert (box.name, box.network) == ("tf-j-abc-a3-r1", "tf-j-abc-a3")
    assert box.labels == {"tf.stack": "stack-9", "tf.job": "j-abc", "tf.team": "team-a", "tf.attempt": "3",
                          "tf.rank": "1"}
    assert (box.nano_cpus, box.memory, box.gpu_ids) == (1_500_000_000, 512 * 2**20, (1,))
    assert (str(spec.workdir), str(spec.workdir), False) in box.mounts
    assert all(ro for src, dst, ro in box.mounts if dst != str(spec.workdir))
    assert any(dst == sys.base_prefix for _, dst, _ in box.mounts), "the interpreter is mounted"
    assert box.reason_path == str(spec.exit_reason_path)


def test_a_learners_container_is_hardened_with_the_jobs_uid_and_the_manifests_pids_limit(tmp_path):
    plan, _ = plan_for(tmp_path)
    spec = plan.learners[0]
    box = containers.container_plan(plan, spec, engine_url="", image="i", stack="s", python=sys.executable)
    assert box.uid == job_uid("j-abc") >= 1_000_000_000, "the local sandbox's unprivileged uid for the job"
    assert box.pids_limit == plan.manifest.resources.pids == 4096
    req = ContainerRequest(name=box.name, image=box.image, command=["true"], env={}, labels=box.labels,
                           network=box.network, ip=box.ip, nano_cpus=box.nano_cpus, memory=box.memory,
                           mounts=box.mounts, user=f"{box.uid}:{box.uid}", pids_limit=box.pids_limit)
    config = host_config(req, "1.41")
    assert config["CapDrop"] == ["ALL"] and "CapAdd" not in config
    assert config["SecurityOpt"] == ["no-new-privileges"]
    assert config["PidsLimit"] == 4096 and config["Memory"] == config["MemorySwap"] == 512 * 2**20
    assert config["Init"] is True and config["NetworkMode"] == box.network


def test_mounts_below_root_get_a_read_only_skeleton_of_0755_folders(tmp_path):
    plan, _ = plan_for(tmp_path)
    mounts = [("/a", "/root/.pyenv/versions/3", True), ("/b", "/root/.trainforge/work/j/1/0", False),
              ("/c", "/opt/venv", True)]
    assert containers.skeletons([("/c", "/opt/venv", True), ("/d", "/rooted", True)], tmp_path) == {}
    tops = containers.skeletons(mounts, tmp_path / "sk")
    assert tops == {"/root": str(tmp_path / "sk" / "root")}
    box = containers.container_plan(plan, plan.learners[0], engine_url="", image="i", stack="s",
                                    python=sys.executable).model_copy(update={"mounts": tuple(mounts),
                                                                              "skeletons": tops})
    containers.build_skeletons(box)
    skeleton = tmp_path / "sk" / "root"
    for sub in ("", ".pyenv", ".pyenv/versions", ".pyenv/versions/3", ".trainforge/work/j/1/0"):
        assert (skeleton / sub).is_dir() and (skeleton / sub).stat().st_mode & 0o777 == 0o755, sub
    assert sorted(p.name for p in skeleton.iterdir()) == [".pyenv", ".trainforge"], "nothing but mount points"
    real = containers.container_plan(plan, plan.learners[0], engine_url="", image="i", stack="s",
                                     python=sys.executable)
    if any(dst.startswith("/root/") for _, dst, _ in real.mounts):
        assert (real.skeletons["/root"], "/root", True) in real.mounts


def test_the_runner_hands_the_workdir_to_the_jobs_uid_as_root_and_runs_as_itself_otherwise(tmp_path):
    plan, _ = plan_for(tmp_path)
    box = containers.container_plan(plan, plan.learners[0], engine_url="", image="i", stack="s",
                                    python=sys.executable)
    work = tmp_path / "w"
    (work / "ckpt").mkdir(parents=True)
    (work / "ckpt" / "model.pt").write_text("x")
    (work / "link").symlink_to("/etc/passwd")
    assert container_user(box, work, euid=1234).startswith("1234:")
    assert work.stat().st_uid == os.geteuid(), "a platform that is not root changes nothing"
    if os.geteuid() != 0:
        pytest.skip("handing the workdir to another uid needs root")
    assert container_user(box, work) == f"{box.uid}:{box.uid}"
    for path in (work, work / "ckpt", work / "ckpt" / "model.pt"):
        assert (path.stat().st_uid, path.stat().st_gid) == (box.uid, box.uid)
    assert (work / "link").lstat().st_uid == box.uid and Path("/etc/passwd").stat().st_uid == 0, \
        "the link itself is handed over, never its target"
    env = container_env(box, {}, {"HOME": "/root"})
    assert env["HOME"] == "/tmp", "the job's uid cannot write the image's /root"


def test_gpu_device_requests_are_built_for_the_nvidia_runtime():
    assert device_requests(()) == []
    (req,) = device_requests((0, 2))
    assert (req["Driver"], req["DeviceIDs"], req["Capabilities"]) == ("nvidia", ["0", "2"], [["gpu"]])


def test_label_filters_match_a_value_or_any():
    assert label_filter({"tf.job": "j-1", "tf.stack": ""}) == ["tf.job=j-1", "tf.stack"]


def test_the_container_env_puts_the_platform_before_the_images_pythonpath(tmp_path):
    plan, _ = plan_for(tmp_path)
    box = containers.container_plan(plan, plan.learners[0], engine_url="", image="i", stack="s",
                                    python=sys.executable)
    env = container_env(box, {"PYTHONPATH": "/opt/image-libs", "PATH": "/usr/bin"},
                        {"PATH": "/venv/bin", "TF_RANK": "0"})
    # the helper's folder only when it is installed under its name; an editable install's finder maps it
    assert env["PYTHONPATH"] == ":".join(p for p in (containers.HELPER_PATH, "/opt/image-libs") if p)
    assert str(containers.HELPER) in {target for _, target, _ in box.mounts}
    assert env["PATH"] == "/venv/bin:/usr/bin" and env["TF_RANK"] == "0"
    assert env["TINI_KILL_PROCESS_GROUP"] == "1"
    # the job's own PYTHONPATH (the manifest's) is kept, between the platform's and the image's
    mine = container_env(box, {"PYTHONPATH": "/opt/image-libs"}, {"PYTHONPATH": "/work/src"})
    assert mine["PYTHONPATH"] == ":".join(p for p in (containers.HELPER_PATH, "/work/src", "/opt/image-libs") if p)
    assert human_bytes(256 * 2**20) == "256Mi" and human_bytes(2 * 2**30) == "2Gi" and human_bytes(1000) == "1000B"


def test_a_spec_without_launcher_serialises_as_before(tmp_path):
    plan, _ = plan_for(tmp_path)
    spec = plan.learners[0]
    assert "launcher" not in json.loads(spec.to_json())
    launched = spec.model_copy(update={"launcher": ["/py", "runner.py", "c.json"]})
    assert '"launcher"' in launched.to_json()
    assert type(spec).parse(launched.to_json()).launcher == ["/py", "runner.py", "c.json"]


def test_the_controller_runs_a_launcher_before_the_shell_and_reports_its_reason(tmp_path):
    from trainforge_services.controller.learner import GUARD, guarded_argv, launcher_reason

    # the controller puts the launcher before the shell (a sandbox's entry takes that place without one)
    assert guarded_argv("python t.py", 7, "/py", ["/py", "runner.py", "c.json", "/bin/sh", "-c", "python t.py"]) == [
        "/py", "-I", "-S", str(GUARD), "7", "/py", "runner.py", "c.json", "/bin/sh", "-c", "python t.py"]
    assert guarded_argv("x", 7, "/py") == ["/py", "-I", "-S", str(GUARD), "7", "/bin/sh", "-c", "x"]
    plan, _ = plan_for(tmp_path)
    spec = plan.learners[0]
    spec.exit_reason_path.parent.mkdir(parents=True)
    spec.exit_reason_path.write_text("the learner was OOM-killed: it reached its memory limit of 512Mi\n")
    assert launcher_reason(spec) == "", "without a launcher the file is not the controller's business"
    launched = spec.model_copy(update={"launcher": ["/py", "runner.py", "c.json"]})
    assert launcher_reason(launched) == "the learner was OOM-killed: it reached its memory limit of 512Mi"


def test_an_elastic_jobs_containers_carry_torchruns_c10d_rendezvous_and_grown_slots_get_theirs(tmp_path):
    """The docker backend's elastic job: every slot's container, the first ones and those it grows into,
    runs a torchrun agent whose PET_* env points at slot 0's container (the c10d store's host) and names
    itself by its own container's address."""
    from trainforge_services.controller.learner import learner_command, learner_env
    from trainforge_services.lcm.lifecycle.plan import with_learners

    manifest = Manifest(name="el", framework="torch", learners={"min": 1, "max": 3}, command="python train.py",
                        image="team/img:1", resources={"cpus": 1, "memory": "512Mi"})
    job = JobDeployment(job_id="j-el", team="team-a", attempt=2, manifest=manifest)
    subnet = containers.pick_subnet("j-el", 2, set())
    site = Site(attempt_dir=tmp_path / "j-el" / "2", master_addr=containers.rank_address(subnet, 0),
                master_port=containers.MASTER_PORT)
    plan = build_plan(job, site, [], lease_ttl=10, start_timeout=30, size=1)
    opts = {"engine_url": "unix:///x.sock", "image": "team/img:1", "stack": "s", "python": sys.executable}
    started = containers.in_containers(plan, [0], **opts)
    grown = containers.in_containers(with_learners(plan, {1: [], 2: []}), [1, 2], **opts)
    assert not grown.learners[0].launcher, "a running slot's spec is left as it is"

    for spec in (started.learners[0], *grown.learners[1:]):
        box = containers.ContainerPlan.load(spec.launcher[2])
        assert spec.launcher == [sys.executable, str(containers.RUNNER), str(site.attempt_dir /
                                                                            f"container-{spec.rank}.json")]
        assert (box.name, box.network, box.ip) == (f"tf-j-el-a2-r{spec.rank}", "tf-j-el-a2",
                                                   containers.rank_address(subnet, spec.rank))
        assert box.labels["tf.rank"] == str(spec.rank)
        env = container_env(box, {"PATH": "/usr/bin"}, learner_env(spec, base={"PATH": "/bin"}))
        assert env["PET_RDZV_BACKEND"] == "c10d" and env["PET_NNODES"] == "1:3" and env["PET_NPROC_PER_NODE"] == "1"
        assert env["PET_RDZV_ENDPOINT"] == f"{site.master_addr}:{containers.MASTER_PORT}"
        assert env["PET_RDZV_ID"] == "j-el-2"
        assert f"is_host={int(spec.rank == 0)}" in env["PET_RDZV_CONF"], "the c10d store lives in slot 0"
        assert env["PET_LOCAL_ADDR"] == box.ip, "an agent must be reachable at its container's address"
        assert "RANK" not in env and "MASTER_ADDR" not in env  # torchrun gives each group's worker its own
        assert learner_command(spec).startswith("exec python -m torch.distributed.run --no-python ")


def test_a_fixed_size_jobs_containers_get_no_torchrun_env(tmp_path):
    plan, _ = plan_for(tmp_path)
    box = containers.container_plan(plan, plan.learners[1], engine_url="", image="i", stack="s",
                                    python=sys.executable)
    env = container_env(box, {}, {"MASTER_ADDR": plan.master_addr, "RANK": "1"})
    assert "PET_LOCAL_ADDR" not in env and env["MASTER_ADDR"] == plan.master_addr


def test_the_runner_knows_this_hosts_addresses_and_gates_a_command_on_a_fifo(tmp_path):
    assert "127.0.0.1" in host_addresses()
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    argv = egress_gate(["/bin/sh", "-c", "echo ran $0", "x"], str(fifo))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    fd = os.open(fifo, os.O_RDWR)  # the runner's end, written once the relays listen
    os.write(fd, b"go\n")
    out, _ = proc.communicate(timeout=30)
    os.close(fd)
    assert out == "ran x\n"

"""The LCM's pure parts: request validation, GPU detection, the children's environment, backend choice."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainforge_protos import lcm_pb2
from trainforge_services.common.contracts.ids import check_job_id
from trainforge_services.common.errors import InvalidArgument, Unavailable
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.backends import make_backend
from trainforge_services.lcm.backends.local import child_env, detect_gpus
from trainforge_services.lcm.lifecycle import JobDeployment, deployment_from_request

MANIFEST = Manifest(name="mnist", learners=3, command="python train.py")


def request(**kw) -> lcm_pb2.DeployJobRequest:
    values = dict(job_id="j-0123abcd", team="team-a", attempt=2, manifest_json=MANIFEST.model_dump_json(),
                  code_uri="store://jobs/j-0123abcd/code.tar.gz", checkpoint_uri="store://ckpt")
    return lcm_pb2.DeployJobRequest(**{**values, **kw})


def test_a_deploy_request_becomes_a_validated_deployment():
    job = deployment_from_request(request())
    assert job == JobDeployment(job_id="j-0123abcd", team="team-a", attempt=2, manifest=MANIFEST,
                                code_uri="store://jobs/j-0123abcd/code.tar.gz", checkpoint_uri="store://ckpt")
    assert job.world_size == 3


@pytest.mark.parametrize(("change", "field"), [
    ({"job_id": ""}, "job_id"), ({"job_id": "../x"}, "job_id"), ({"job_id": "a/b"}, "job_id"),
    ({"job_id": "a" * 64}, "job_id"), ({"team": ""}, "team"), ({"attempt": 0}, "attempt"),
    ({"manifest_json": ""}, "manifest_json"), ({"manifest_json": '{"name": "x"}'}, "command"),
])
def test_bad_deploy_requests_name_the_field(change, field):
    with pytest.raises(InvalidArgument) as e:
        deployment_from_request(request(**change))
    assert field in {d["field"] for d in e.value.details}


def test_job_ids_the_trainer_makes_are_accepted():
    assert check_job_id("j-5f3a9c01b2de") == "j-5f3a9c01b2de"
    assert check_job_id("mnist-run-2") == "mnist-run-2"
    for bad in ("..", "mnist.run_2", "Mnist-run", "a" * 41):
        with pytest.raises(InvalidArgument):
            check_job_id(bad)


def fake_nvidia_smi(tmp_path: Path, body: str) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)


def test_gpus_are_counted_from_nvidia_smi(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, 'echo "GPU 0: NVIDIA H100 (UUID: GPU-1)"\necho "GPU 1: NVIDIA H100 (UUID: GPU-2)"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert detect_gpus() == 2


def test_no_gpus_without_a_working_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_gpus() == 0
    fake_nvidia_smi(tmp_path, 'echo "NVIDIA-SMI has failed" >&2\nexit 9')
    assert detect_gpus() == 0


def test_children_get_the_lcms_settings_and_can_import_the_project(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/opt/extra")
    monkeypatch.setenv("TF_STACK_ID", "stack-1")
    monkeypatch.delenv("TF_BACKEND", raising=False)
    settings = LcmSettings(state_dir=tmp_path, etcd_endpoints="10.0.0.1:2379", etcd_prefix="/x", dev_mode=True,
                           lease_ttl=12, backend="docker")
    env = child_env(settings)
    # no source folder on the path: the interpreter imports the platform from its installation
    assert env["PYTHONPATH"] == "/opt/extra"
    imported = subprocess.run([sys.executable, "-P", "-c", "import trainforge_services.controller.controller"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert imported.returncode == 0, imported.stderr
    assert (env["TF_ETCD_ENDPOINTS"], env["TF_ETCD_PREFIX"], env["TF_STATE_DIR"]) == ("10.0.0.1:2379", "/x",
                                                                                       str(tmp_path))
    assert (env["TF_DEV_MODE"], env["TF_LEASE_TTL"], env["TF_STACK_ID"]) == ("true", "12", "stack-1")
    assert "TF_BACKEND" not in env  # the LCM's own settings are not the children's


def test_the_kubernetes_backend_outside_a_cluster_without_a_kubeconfig_names_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(InvalidArgument, match="cannot load the Kubernetes configuration") as e:
        make_backend(LcmSettings(backend="kubernetes", state_dir=tmp_path))
    assert e.value.details[0]["field"].startswith("kube_config")
    with pytest.raises(InvalidArgument, match="no-such.yaml"):
        make_backend(LcmSettings(backend="kubernetes", state_dir=tmp_path, kube_config=str(tmp_path / "no-such.yaml")))


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_the_docker_backend_is_made_without_reaching_its_engine(tmp_path):
    backend = make_backend(LcmSettings(backend="docker", state_dir=tmp_path,
                                       docker_url=f"unix://{tmp_path}/no-such.sock"))
    assert backend.name == "docker"
    with pytest.raises(Unavailable, match="docker engine at unix://.*no-such.sock is unreachable"):
        backend.capacity()
    backend.close()
    gc.collect()  # the SDK's failed connection leaves its socket to the collector: collect it here

"""The launch environment and argv a backend hands a torch learner, asserted exactly."""

from __future__ import annotations

import pytest

from trainforge_frameworks.torch.launch import ddp_env, torchrun_argv


def test_ddp_env_defaults_to_one_learner_per_node():
    assert ddp_env(1, 4, "10.0.0.5", 29500) == {
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }


def test_ddp_env_with_local_ranks():
    assert ddp_env(5, 8, "host-0.job", 1234, local_rank=1, local_world_size=4) == {
        "MASTER_ADDR": "host-0.job",
        "MASTER_PORT": "1234",
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
    }


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rank": 2, "world_size": 2}, "rank 2 must be less than world_size 2"),
    ({"rank": -1}, "rank must be a non-negative integer"),
    ({"world_size": 0}, "world_size must be a positive integer"),
    ({"master_addr": " "}, "master_addr must be a host name"),
    ({"master_port": 0}, "master_port must be an integer in 1..65535"),
    ({"master_port": 70000}, "master_port must be an integer in 1..65535"),
    ({"local_rank": 1}, "local_rank 1 must be less than local_world_size 1"),
    ({"local_world_size": 3}, "local_world_size 3 must not exceed world_size 2"),
    ({"rank": True}, "rank must be a non-negative integer"),
])
def test_ddp_env_rejects_inconsistent_values(kwargs, message):
    args = {"rank": 0, "world_size": 2, "master_addr": "127.0.0.1", "master_port": 29500} | kwargs
    with pytest.raises(ValueError, match=message):
        ddp_env(**args)


def test_torchrun_argv_for_a_script():
    assert torchrun_argv("train.py", ["--epochs", "3"], nnodes=2, nproc_per_node=4, node_rank=1,
                         master_addr="learner-0.job", master_port=29400) == [
        "python", "-m", "torch.distributed.run",
        "--nnodes=2", "--nproc-per-node=4", "--node-rank=1",
        "--master-addr=learner-0.job", "--master-port=29400", "--max-restarts=0",
        "train.py", "--epochs", "3",
    ]


def test_torchrun_argv_for_a_module_with_an_explicit_interpreter():
    assert torchrun_argv("pkg.train", python="/opt/py/bin/python3", max_restarts=2, module=True) == [
        "/opt/py/bin/python3", "-m", "torch.distributed.run",
        "--nnodes=1", "--nproc-per-node=1", "--node-rank=0",
        "--master-addr=127.0.0.1", "--master-port=29500", "--max-restarts=2",
        "--module", "pkg.train",
    ]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"script": ""}, "script must name"),
    ({"nnodes": 2, "node_rank": 2}, "node_rank 2 must be less than nnodes 2"),
    ({"nproc_per_node": 0}, "nproc_per_node must be a positive integer"),
    ({"max_restarts": -1}, "max_restarts must be a non-negative integer"),
    ({"master_port": 65536}, "master_port must be an integer"),
])
def test_torchrun_argv_rejects_bad_values(kwargs, message):
    args = {"script": "train.py"} | kwargs
    with pytest.raises(ValueError, match=message):
        torchrun_argv(**args)

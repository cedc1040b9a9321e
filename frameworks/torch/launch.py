"""How a torch learner is told where it sits in a DDP job.

Pure functions, so the exact environment and argv a backend hands a learner
can be asserted in a unit test and read in one place. The controller uses
`ddp_env` when it starts one learner process per rank (env:// rendezvous);
a backend that starts one process per node and lets torchrun fork the ranks
uses `torchrun_argv`. A learner of an elastic job (manifest `learners:
{min, max}`) is one torchrun agent node: `elastic_env` (the PET_* variables,
c10d rendezvous) and `elastic_argv`.

The local ranks default to "one learner per node" (0 of 1): every learner
sees only its own GPUs through CUDA_VISIBLE_DEVICES, so its device is always
index 0 whatever its global rank.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence


def _check_addr_port(master_addr: str, master_port: int) -> None:
    if not master_addr or not master_addr.strip():
        raise ValueError("master_addr must be a host name or address, not empty")
    if isinstance(master_port, bool) or not isinstance(master_port, int) or not 1 <= master_port <= 65535:
        raise ValueError(f"master_port must be an integer in 1..65535, got {master_port!r}")


def _check_index(name: str, value: int, size_name: str, size: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if value >= size:
        raise ValueError(f"{name} {value} must be less than {size_name} {size}")


def _check_size(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def ddp_env(rank: int, world_size: int, master_addr: str, master_port: int,
            local_rank: int | None = None, local_world_size: int | None = None) -> dict[str, str]:
    """The env:// rendezvous variables torch.distributed.init_process_group reads."""
    _check_size("world_size", world_size)
    _check_index("rank", rank, "world_size", world_size)
    _check_addr_port(master_addr, master_port)
    local_world_size = 1 if local_world_size is None else local_world_size
    local_rank = 0 if local_rank is None else local_rank
    _check_size("local_world_size", local_world_size)
    if local_world_size > world_size:
        raise ValueError(f"local_world_size {local_world_size} must not exceed world_size {world_size}")
    _check_index("local_rank", local_rank, "local_world_size", local_world_size)
    return {
        "MASTER_ADDR": master_addr.strip(),
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
    }


def torchrun_argv(script: str, script_args: Sequence[str] = (), *, nnodes: int = 1, nproc_per_node: int = 1,
                  node_rank: int = 0, master_addr: str = "127.0.0.1", master_port: int = 29500,
                  max_restarts: int = 0, module: bool = False, python: str = "python") -> list[str]:
    """argv that runs `script` under torchrun with a static rendezvous.

    `python` is resolved through PATH by default: the controller puts the
    platform interpreter's bin directory first. With `module`, `script` is a
    module name run as `python -m`.
    """
    if not script or not script.strip():
        raise ValueError("script must name a file or module to run")
    _check_size("nnodes", nnodes)
    _check_size("nproc_per_node", nproc_per_node)
    _check_index("node_rank", node_rank, "nnodes", nnodes)
    _check_addr_port(master_addr, master_port)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a non-negative integer, got {max_restarts!r}")
    argv = [
        python, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        f"--node-rank={node_rank}",
        f"--master-addr={master_addr.strip()}",
        f"--master-port={master_port}",
        f"--max-restarts={max_restarts}",
    ]
    if module:
        argv.append("--module")
    return [*argv, script, *script_args]


# Rendezvous settings of an elastic job's torchrun agents (`--rdzv-conf`): a round closes soon after the
# minimum joined, and a node that stopped heartbeating is dropped after about 10 s, so a lost learner shrinks
# the group quickly while a busy (not dead) one on a loaded machine is not mistaken for lost.
ELASTIC_RDZV_CONF = {"last_call_timeout": "2", "keep_alive_interval": "2", "keep_alive_max_attempt": "5",
                     "join_timeout": "120"}


def elastic_restarts(max_nodes: int, job_restarts: int = 0) -> int:
    """How many worker-group failures an elastic learner's agent restarts from: each lost peer costs the
    survivors one, so a job may lose every learner above its minimum a few times over (plus the job's own
    `restart.max_restarts`)."""
    return 3 * max_nodes + job_restarts


def elastic_env(*, min_nodes: int, max_nodes: int, endpoint_host: str, endpoint_port: int, run_id: str,
                max_restarts: int, host_store: bool, local_addr: str | None = None) -> dict[str, str]:
    """The PET_* variables torchrun reads as its defaults: one agent node of an elastic job.

    `local_addr` is the address the other nodes reach this one at (the
    worker group's MASTER_ADDR when this node leads it); left out, torchrun
    uses the host's FQDN, which must then resolve (a pod's hostname under
    its headless Service does; a sandbox's private hostname does not).

    The c10d rendezvous store lives in the agent started with `host_store`
    (the learner in slot 0); every other agent connects to it at the
    endpoint. `max_restarts` counts worker-group failures (a lost peer is
    one); a node joining restarts the group without counting.
    """
    _check_size("min_nodes", min_nodes)
    _check_size("max_nodes", max_nodes)
    if max_nodes < min_nodes:
        raise ValueError(f"max_nodes {max_nodes} must be at least min_nodes {min_nodes}")
    _check_addr_port(endpoint_host, endpoint_port)
    if not run_id or not run_id.strip():
        raise ValueError("run_id must name the rendezvous, not be empty")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a non-negative integer, got {max_restarts!r}")
    conf = {"is_host": "1" if host_store else "0", **ELASTIC_RDZV_CONF}
    local = {"PET_LOCAL_ADDR": local_addr.strip()} if local_addr and local_addr.strip() else {}
    return {**local,
        "PET_NNODES": f"{min_nodes}:{max_nodes}",
        "PET_NPROC_PER_NODE": "1",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{endpoint_host.strip()}:{endpoint_port}",
        "PET_RDZV_ID": run_id.strip(),
        "PET_RDZV_CONF": ",".join(f"{k}={v}" for k, v in conf.items()),
        "PET_MAX_RESTARTS": str(max_restarts),
        "PET_MONITOR_INTERVAL": "0.5",
        # every node runs one worker of the same role: ranks follow from the node's group rank, without
        # the store round trip (whose role_info wait hangs a group re-formed after a loss in torch 2.x)
        "TORCH_ELASTIC_WORKER_IDENTICAL": "1",
        # each round publishes its own MASTER_ADDR: with the shared store, a group leader of an earlier round
        # never does again, and a node joining later waits for it until the rendezvous times out
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }


def elastic_argv(command: str, *, python: str = "python") -> list[str]:
    """argv of an elastic learner: a torchrun agent (settings from `elastic_env`) whose one worker per
    (re)start runs `command` through the shell, with RANK, WORLD_SIZE and MASTER_* of the current group."""
    if not command or not command.strip():
        raise ValueError("command must not be empty")
    # a simple command replaces the shell, so the worker torchrun signals (to stop it when the group
    # changes) is the training process itself, not a shell that would die and leave it running
    simple = not any(c in command for c in ";&|<>()`$\n")
    return [python, "-m", "torch.distributed.run", "--no-python", "/bin/sh", "-c",
            f"exec {command.strip()}" if simple else command]


def elastic_command(command: str, *, python: str = "python") -> str:
    """`elastic_argv` as one shell command (`exec`, so the agent is the process the platform signals)."""
    return "exec " + shlex.join(elastic_argv(command, python=python))

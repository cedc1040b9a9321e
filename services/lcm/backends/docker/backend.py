"""The docker backend: each learner's command runs in a container on a Docker engine.

Where things run, and why. The job monitor and each learner's controller run
on this machine exactly as with the local backend (this class extends it):
etcd, the log store and the object store are on the LCM's network (often
loopback), which a container on an internal network cannot reach, and the
controller's contract (status under a lease, halt with SIGTERM and a grace,
checkpoints, log shipping, outputs) then holds unchanged. The controller
runs its learner through `runner.py` (the spec's `launcher`), which starts
the learner's container and stands in for the command: signals go to the
container, its output comes back, its exit code and reason are reported.

Per attempt the backend creates one internal network with static addresses
(`containers.py`); rank 0's address is the DDP rendezvous in the plan, and
for an elastic job the c10d rendezvous endpoint (`PET_RDZV_ENDPOINT`) that
slot 0's torchrun agent hosts; each agent names itself by its container's
address (`PET_LOCAL_ADDR`, runner.py). A slot an elastic job grows into, or
a lost one started again (`launch_learners`), gets its container the same
way, at the slot's address on the attempt's network. The
image is the manifest's `image:` or `settings.docker_image`; a missing one
fails the deploy naming it, an unreachable engine makes it `Unavailable`
(the Trainer waits and deploys again; the job is not lost). `stop` lets the
controllers halt their containers first, then removes every container and
network that carries the job's labels: whatever an earlier LCM, a dead
runner or an older attempt left behind.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from trainforge_services.common.adapters.docker_engine import ContainerView, Engine
from trainforge_services.common.errors import ResourceExhausted, TrainforgeError
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.backends.base import AttemptPlan, Capacity, Handle, Site
from trainforge_services.lcm.backends.docker import containers
from trainforge_services.lcm.backends.local import KILL_GRACE, LocalBackend
from trainforge_services.lcm.backends.local.processes import detect_gpus

log = logging.getLogger(__name__)


class DockerBackend(LocalBackend):
    name = "docker"

    def __init__(self, settings: LcmSettings, *, kill_grace: float = KILL_GRACE, engine: Engine | None = None):
        super().__init__(settings, kill_grace=kill_grace)
        self._engine = engine or Engine(settings.docker_url)
        self._url = settings.docker_url
        self._stack = containers.stack_label()
        self._python = settings.python or sys.executable
        self._gpu_count: int | None = None if settings.local_gpus < 0 else settings.local_gpus

    @property
    def engine(self) -> Engine:
        return self._engine

    def image_of(self, plan: AttemptPlan) -> str:
        return plan.manifest.image or self._settings.docker_image

    # -- Backend --------------------------------------------------------------------

    def site(self, job_id: str, attempt: int) -> Site:
        subnet = containers.pick_subnet(job_id, attempt, self._engine.used_subnets())
        return Site(attempt_dir=self._work / job_id / str(attempt), master_addr=containers.rank_address(subnet, 0),
                    master_port=containers.MASTER_PORT)

    def launch(self, plan: AttemptPlan) -> list[Handle]:
        image = self.image_of(plan)
        self._engine.image_env(image)  # NotFound naming the image; Unavailable when the engine is away
        self._check_room(plan)
        net_labels = containers.labels(self._stack, plan.job_id, plan.team, plan.attempt)
        name = containers.network_name(plan.job_id, plan.attempt)
        if name not in self._engine.networks(net_labels):
            self._engine.create_network(name, str(containers.subnet_of(plan.master_addr)), net_labels)
        plan.attempt_dir.mkdir(parents=True, exist_ok=True)
        return super().launch(self._in_containers(plan, image, [spec.rank for spec in plan.learners]))

    def launch_learners(self, plan: AttemptPlan, ranks: list[int]) -> list[Handle]:
        """Slots of a running elastic attempt (it grows, or a lost learner's slot starts again), each in its
        container on the attempt's network."""
        return super().launch_learners(self._in_containers(plan, self.image_of(plan), ranks), ranks)

    def _in_containers(self, plan: AttemptPlan, image: str, ranks: list[int]) -> AttemptPlan:
        # where the controllers build a manifest's `requirements:` (ControllerSettings.env_cache, which they
        # read from the same environment): the learner runs that environment's interpreter in its container
        env_cache = Path(os.environ.get("TF_ENV_CACHE_DIR") or Path(self._settings.state_dir) / "envs").resolve()
        env_cache.mkdir(parents=True, exist_ok=True)
        return containers.in_containers(plan, ranks, engine_url=self._url, image=image, stack=self._stack,
                                        python=self._python, env_cache=env_cache)

    def _check_room(self, plan: AttemptPlan) -> None:
        """The engine's CPUs and memory minus what the running containers of other jobs hold."""
        free_cpus, free_memory = self.free()
        res, n = plan.manifest.resources, plan.world_size
        if res.cpus * n > free_cpus + 1e-9:
            raise ResourceExhausted(f"needs {res.cpus * n:g} CPU(s); the docker engine has {free_cpus:g} free")
        if res.memory * n > free_memory:
            raise ResourceExhausted(f"needs {res.memory * n} bytes of memory; the docker engine has {free_memory} "
                                    "free")

    def free(self) -> tuple[float, int]:
        """(CPUs, bytes of memory) the engine has beyond what running platform containers are limited to."""
        info = self._engine.info()
        held = [c for c in self._engine.containers({"tf.stack": self._stack}) if c.running]
        return (info.cpus - sum(c.nano_cpus for c in held) / 1e9, info.memory - sum(c.memory for c in held))

    def stop(self, job_id: str) -> int:
        """Stop the monitor and the controllers (each halts its container), then remove what carries the job's
        labels; Unavailable while the engine cannot be reached (the kill is asked again)."""
        stopped = super().stop(job_id)
        job = {"tf.stack": self._stack, "tf.job": job_id}
        leftover = self._engine.remove_containers(job)
        self._engine.remove_networks(job)
        if leftover:
            log.info("job %s: removed %d running container(s) no runner was left to stop", job_id, leftover)
        return stopped

    def job_containers(self, job_id: str) -> list[ContainerView]:
        """The job's containers, found by their labels (what an LCM after a restart sees of them)."""
        return self._engine.containers({"tf.stack": self._stack, "tf.job": job_id})

    def capacity(self) -> Capacity:
        info = self._engine.info()
        if self._gpu_count is None:
            self._gpu_count = detect_gpus() if "nvidia" in info.runtimes else 0
        return Capacity(backend=self.name, gpus=self._gpu_count, cpus=float(self._settings.local_cpus or info.cpus),
                        memory=int(self._settings.local_memory or info.memory),
                        max_learners=self._settings.local_max_learners)

    def close(self) -> None:
        super().close()
        try:
            self._engine.close()
        except TrainforgeError:
            pass

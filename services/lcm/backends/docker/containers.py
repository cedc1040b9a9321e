"""What the docker backend decides about an attempt's containers: names, labels, addresses, mounts, limits.

Per attempt there is one internal bridge network with a /24 of its own
(`10.213.<n>.0/24`): rank r's container gets `.(r + 2)`, so rank 0's address
is known before anything starts and goes into the plan as the DDP
rendezvous (container-name DNS needs the engine's iptables rules, which a
private engine may not have). Every network and container carries the
labels `tf.stack`, `tf.team`, `tf.job`, `tf.attempt` (and `tf.rank`), which
is how a restarted LCM, a kill and `trainforge down` find them again.

`ContainerPlan` is written next to each learner's spec; the learner runner
(`runner.py`) reads it and starts the container with the learner's command
and environment. The platform's interpreter, its virtual environment, the
site-packages on its import path and the learner-side helper's package folder
(frameworks/ of this source tree, for an editable install) are bind-mounted
read-only at the paths they have here, the learner's working directory
read-write, so the helper and the platform's torch work in any image that
has a C library; what the image adds (its own packages, via its PYTHONPATH)
comes on top.

Hardening (docs/THREAT_MODEL.md): every container drops all capabilities,
runs with no-new-privileges and the manifest's pids limit, and runs as the
job's unprivileged uid (the local sandbox's, `trainforge_services.common.isolation.job_uid`)
with its workdir handed to that uid by the runner before the start. Mounts
under `/root` (a pyenv interpreter, the default state directory) would be
out of that uid's reach through the image's own `/root` (0700 in Debian's),
so the container's `/root` is a skeleton instead: a host folder per learner
holding only the 0755 folders down to those mounts, bound read-only (the
mount points exist in it, so the engine never has to create one there; a
tmpfs would not do: the runtime gives it the mode of the folder it hides).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict

import trainforge_frameworks
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.errors import ResourceExhausted
from trainforge_services.common.isolation import job_uid
from trainforge_services.lcm.backends.base import AttemptPlan
from trainforge_services.lcm.store import write_atomically

# The learner-side helper's package folder; the folder holding it goes on the learner's PYTHONPATH when the
# package is installed under its name (an editable install maps the name to frameworks/ through a finder in
# the interpreter's site-packages instead).
HELPER = Path(trainforge_frameworks.__file__).resolve().parent
HELPER_PATH = str(HELPER.parent) if HELPER.name == "trainforge_frameworks" else ""
RUNNER = Path(__file__).with_name("runner.py")
MASTER_PORT = 29500
_POOL = ipaddress.ip_network("10.213.0.0/16")
LABEL_PREFIX = "tf."


def stack_label() -> str:
    """The stack every container and network of this LCM belongs to (`trainforge down` removes by it)."""
    return os.environ.get("TF_STACK_ID") or "default"


def labels(stack: str, job_id: str, team: str = "", attempt: int | None = None,
           rank: int | None = None) -> dict[str, str]:
    out = {"tf.stack": stack, "tf.job": job_id}
    if team:
        out["tf.team"] = team
    if attempt is not None:
        out["tf.attempt"] = str(attempt)
    if rank is not None:
        out["tf.rank"] = str(rank)
    return out


def network_name(job_id: str, attempt: int) -> str:
    return f"tf-{job_id}-a{attempt}"


def container_name(job_id: str, attempt: int, rank: int) -> str:
    return f"tf-{job_id}-a{attempt}-r{rank}"


def pick_subnet(job_id: str, attempt: int, used: set[str]) -> ipaddress.IPv4Network:
    """A free /24 of 10.213.0.0/16, starting at one the job's id hashes to (few collisions to skip)."""
    subnets = list(_POOL.subnets(new_prefix=24))
    start = int(hashlib.sha256(f"{job_id}/{attempt}".encode()).hexdigest(), 16) % len(subnets)
    taken = {ipaddress.ip_network(s) for s in used}
    for i in range(len(subnets)):
        net = subnets[(start + i) % len(subnets)]
        if not any(net.overlaps(t) for t in taken):
            return net
    raise ResourceExhausted(f"no free /24 left in {_POOL} for job {job_id}'s network")


def subnet_of(master_addr: str) -> ipaddress.IPv4Network:
    return ipaddress.ip_network(f"{master_addr}/24", strict=False)


def rank_address(subnet: ipaddress.IPv4Network, rank: int) -> str:
    return str(subnet.network_address + rank + 2)


def platform_mounts(python: str) -> list[tuple[str, str, bool]]:
    """Read-only mounts that make the platform's interpreter and code work at the same paths in a container."""
    paths = {str(HELPER)}
    folders = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(python))]
    # and the site-packages folders our import path has beyond those (one a .pth file adds, say)
    folders += [p for p in sys.path if os.path.isabs(p) and os.path.basename(p) in ("site-packages", "dist-packages")]
    for p in folders:
        paths.add(p)
        paths.add(os.path.realpath(p))
    return [(os.path.realpath(p), p, True) for p in sorted(paths) if os.path.isdir(p)]


# Top-level folders an image keeps private to root (Debian's /root is 0700): replaced by a skeleton when a mount
# lies below one.
PRIVATE_TOPS = ("/root",)


def skeletons(mounts: list[tuple[str, str, bool]], folder: Path) -> dict[str, str]:
    """{private top: host skeleton folder} for each private top a mount lies below (`folder`/<top's name>)."""
    dsts = [dst for _, dst, _ in mounts]
    return {top: str(folder / top.strip("/")) for top in PRIVATE_TOPS if any(d.startswith(top + "/") for d in dsts)}


def build_skeletons(plan: ContainerPlan) -> None:
    """Make each skeleton: root-owned 0755 folders down to every mount point below its top (the runner, as root)."""
    for top, skeleton in plan.skeletons.items():
        Path(skeleton).mkdir(parents=True, exist_ok=True)
        os.chmod(skeleton, 0o755)
        for _, dst, _ in plan.mounts:
            if dst.startswith(top + "/"):
                path = Path(skeleton)
                for part in Path(dst).relative_to(top).parts:
                    path = path / part
                    path.mkdir(exist_ok=True)
                    os.chmod(path, 0o755)


class ContainerPlan(BaseModel):
    """One learner's container, decided by the backend; read by the runner."""

    model_config = ConfigDict(frozen=True)

    engine_url: str
    name: str
    image: str
    network: str
    ip: str
    labels: dict[str, str]
    nano_cpus: int
    memory: int
    gpu_ids: tuple[int, ...] = ()
    mounts: tuple[tuple[str, str, bool], ...] = ()
    workdir: str
    pythonpath: str  # put before the image's own PYTHONPATH
    reason_path: str
    uid: int = 0  # the job's uid (and gid) the learner runs as; the runner hands the workdir to it
    pids_limit: int = 0
    skeletons: dict[str, str] = {}  # container path -> host folder bound read-only there (build_skeletons)

    @classmethod
    def load(cls, path: str | Path) -> ContainerPlan:
        return cls.model_validate_json(Path(path).read_text())


def container_plan(plan: AttemptPlan, spec: LearnerSpec, *, engine_url: str, image: str, stack: str,
                   python: str, env_cache: Path | None = None) -> ContainerPlan:
    """`env_cache`: the controllers' per-job environments (a manifest's `requirements:`), mounted read-only."""
    subnet = subnet_of(plan.master_addr)
    res = plan.manifest.resources
    mounts = [*platform_mounts(python), (str(spec.workdir), str(spec.workdir), False)]
    if env_cache is not None:
        mounts.append((str(env_cache), str(env_cache), True))
    tops = skeletons(mounts, plan.attempt_dir / f"container-{spec.rank}-skeleton")
    mounts += [(host, top, True) for top, host in tops.items()]
    return ContainerPlan(
        engine_url=engine_url, name=container_name(plan.job_id, plan.attempt, spec.rank), image=image,
        network=network_name(plan.job_id, plan.attempt), ip=rank_address(subnet, spec.rank),
        labels=labels(stack, plan.job_id, plan.team, plan.attempt, spec.rank),
        nano_cpus=int(res.cpus * 1e9), memory=res.memory, gpu_ids=tuple(spec.gpu_ids), mounts=tuple(mounts),
        workdir=str(spec.workdir), pythonpath=HELPER_PATH, reason_path=str(spec.exit_reason_path),
        uid=job_uid(plan.job_id), pids_limit=res.pids, skeletons=tops)


def in_containers(plan: AttemptPlan, ranks: list[int], *, engine_url: str, image: str, stack: str, python: str,
                  env_cache: Path | None = None) -> AttemptPlan:
    """The plan with the learners of `ranks` run by the container runner: each one's container plan written
    next to its spec (`container-<rank>.json`) and the runner as its spec's launcher."""
    learners = list(plan.learners)
    for rank in ranks:
        spec = learners[rank]
        box = container_plan(plan, spec, engine_url=engine_url, image=image, stack=stack, python=python,
                             env_cache=env_cache)
        path = plan.attempt_dir / f"container-{spec.rank}.json"
        write_atomically(path, box.model_dump_json(indent=2))
        learners[rank] = spec.model_copy(update={"launcher": [python, str(RUNNER), str(path)]})
    return plan.model_copy(update={"learners": tuple(learners)})

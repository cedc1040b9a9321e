"""The Docker engine, as the platform uses it: the only module that imports the `docker` SDK.

The docker backend (`services/lcm/backends/docker/`) and its learner runner
talk to the engine through `Engine`: networks and containers carry the
platform's labels (`tf.stack`, `tf.job`, ...) and are found again by them,
so nothing needs remembering between LCM runs. Engine failures become the
platform's errors: an engine that cannot be reached is `Unavailable` (the
Trainer waits and deploys again), a missing image `NotFound` naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import docker.errors
import docker.types
import requests.exceptions

from trainforge_services.common.errors import NotFound, TrainforgeError, Unavailable

log = logging.getLogger(__name__)

API_VERSION = "1.41"
INHIBIT_IPV4 = "com.docker.network.bridge.inhibit_ipv4"  # the bridge driver's option: no IPv4 address on the bridge
_UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, OSError)


@dataclass(frozen=True)
class EngineInfo:
    cpus: int
    memory: int
    version: str
    runtimes: tuple[str, ...]


@dataclass(frozen=True)
class ContainerView:
    """One container as the engine reports it."""

    id: str
    name: str
    status: str  # created, running, exited, ...
    labels: dict[str, str]
    nano_cpus: int
    memory: int
    exit_code: int
    oom_killed: bool
    error: str
    pid: int = 0  # its init's pid on the engine's host (0 when not running)

    @property
    def running(self) -> bool:
        return self.status in ("created", "running", "restarting")


@dataclass(frozen=True)
class ContainerRequest:
    """Everything one container is started with."""

    name: str
    image: str
    command: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    network: str
    ip: str
    nano_cpus: int
    memory: int
    gpu_ids: tuple[int, ...] = ()
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (host path, container path, read-only)
    workdir: str = ""
    extra_hosts: dict[str, str] | None = None
    user: str = ""  # "uid:gid"; empty: the image's user
    pids_limit: int = 0  # 0: the engine's default (none)
    # Hardening every learner container gets: no capabilities at all, and no way to gain privileges (setuid
    # binaries, file capabilities) inside. A learner needs none: it computes, reads and writes its workdir and
    # talks TCP on its attempt's network.
    cap_drop: tuple[str, ...] = ("ALL",)
    security_opt: tuple[str, ...] = ("no-new-privileges",)


def label_filter(labels: dict[str, str]) -> list[str]:
    """Engine filters for labels; an empty value matches any container that has the label."""
    return [f"{k}={v}" if v else k for k, v in labels.items()]


def device_requests(gpu_ids: tuple[int, ...]) -> list[docker.types.DeviceRequest]:
    """The GPU request of a container (needs the NVIDIA runtime on the engine to run)."""
    if not gpu_ids:
        return []
    return [docker.types.DeviceRequest(driver="nvidia", device_ids=[str(g) for g in gpu_ids],
                                       capabilities=[["gpu"]])]


def host_config(req: ContainerRequest, api_version: str) -> docker.types.HostConfig:
    """The engine's HostConfig for a container: mounts, limits, GPUs, hardening (what `docker inspect` shows)."""
    return docker.types.HostConfig(
        version=api_version,
        binds={src: {"bind": dst, "mode": "ro" if ro else "rw"} for src, dst, ro in req.mounts},
        nano_cpus=req.nano_cpus, mem_limit=req.memory, memswap_limit=req.memory, init=True,
        device_requests=device_requests(req.gpu_ids) or None, extra_hosts=req.extra_hosts or None,
        network_mode=req.network, cap_drop=list(req.cap_drop) or None, security_opt=list(req.security_opt) or None,
        pids_limit=req.pids_limit or None)


class Engine:
    """A connection to one Docker engine (`url`: unix:///path/docker.sock, tcp://host:port; empty: DOCKER_HOST)."""

    def __init__(self, url: str = "", *, timeout: float = 60.0):
        self.url = url
        try:
            # a fixed API version: nothing is asked of the engine until it is used (1.41 is 20.10's; newer
            # engines still speak it, and it has DeviceRequests)
            self._client = (docker.DockerClient(base_url=url, timeout=int(timeout), version=API_VERSION) if url
                            else docker.from_env(timeout=int(timeout), version=API_VERSION))
        except docker.errors.DockerException as e:
            raise Unavailable(f"the docker engine at {url or 'DOCKER_HOST'} cannot be used: {e}") from None

    def _call(self, what: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except docker.errors.NotFound as e:
            raise NotFound(f"{what}: {e.explanation or e}") from None
        except docker.errors.APIError as e:
            raise TrainforgeError(f"{what}: {e.explanation or e}") from None
        except (docker.errors.DockerException, *_UNREACHABLE) as e:
            raise Unavailable(f"the docker engine at {self.url or 'DOCKER_HOST'} is unreachable ({what}): "
                              f"{e}") from None

    # -- engine ---------------------------------------------------------------------

    def ping(self) -> None:
        """Unavailable when the engine does not answer."""
        self._call("ping", self._client.ping)

    def info(self) -> EngineInfo:
        info = self._call("info", self._client.info)
        return EngineInfo(cpus=int(info.get("NCPU") or 0), memory=int(info.get("MemTotal") or 0),
                          version=str(info.get("ServerVersion", "")),
                          runtimes=tuple(sorted((info.get("Runtimes") or {}).keys())))

    # -- images ---------------------------------------------------------------------

    def image_env(self, image: str) -> dict[str, str]:
        """The image's own environment; NotFound naming the image when the engine does not have it."""
        try:
            img = self._client.images.get(image)
        except docker.errors.ImageNotFound:
            raise NotFound(f"image {image} not found on the docker engine; build or pull it there first",
                           details=[{"field": "image", "message": "not found on the docker engine"}]) from None
        except (docker.errors.DockerException, *_UNREACHABLE) as e:
            raise Unavailable(f"the docker engine at {self.url or 'DOCKER_HOST'} is unreachable: {e}") from None
        pairs = (item.split("=", 1) for item in (img.attrs.get("Config") or {}).get("Env") or [])
        return {k: v for k, v in (p for p in pairs if len(p) == 2)}

    def has_image(self, image: str) -> bool:
        try:
            self.image_env(image)
            return True
        except NotFound:
            return False

    def import_image(self, tarball: str, tag: str, changes: list[str] | None = None) -> None:
        repo, _, version = tag.partition(":")
        with open(tarball, "rb") as f:
            self._call("import", self._client.api.import_image_from_data, f, repository=repo,
                       tag=version or "latest", changes=changes)

    def build_image(self, context: str, tag: str) -> None:
        self._call("build", self._client.images.build, path=context, tag=tag, rm=True, forcerm=True)

    # -- networks -------------------------------------------------------------------

    def used_subnets(self) -> set[str]:
        out = set()
        for net in self._call("networks", self._client.networks.list):
            for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
                if cfg.get("Subnet"):
                    out.add(cfg["Subnet"])
        return out

    def create_network(self, name: str, subnet: str, labels: dict[str, str]) -> None:
        """An internal bridge network (no route out) with a fixed subnet, for static addresses, whose bridge has
        no address on the host (`inhibit_ipv4`): a container on it reaches its peers and nothing of the host's,
        not even a service listening on all addresses, whatever the engine's firewall rules."""
        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet)])
        self._call(f"network {name}", self._client.networks.create, name, driver="bridge", internal=True,
                   ipam=ipam, labels=labels, check_duplicate=True, options={INHIBIT_IPV4: "true"})

    def remove_networks(self, labels: dict[str, str]) -> int:
        nets = self._call("networks", self._client.networks.list, filters={"label": label_filter(labels)})
        for net in nets:
            try:
                net.remove()
            except docker.errors.NotFound:
                pass
        return len(nets)

    def networks(self, labels: dict[str, str]) -> list[str]:
        return [n.name for n in self._call("networks", self._client.networks.list,
                                           filters={"label": label_filter(labels)})]

    # -- containers -----------------------------------------------------------------

    def run(self, req: ContainerRequest) -> str:
        """Create and start a container; its id. A leftover container of the same name is removed first."""
        self.remove_container(req.name)
        api = self._client.api
        config = host_config(req, api._version)
        networking = api.create_networking_config({req.network: api.create_endpoint_config(ipv4_address=req.ip)})
        created = self._call(f"container {req.name}", api.create_container, req.image, command=req.command,
                             environment=req.env, labels=req.labels, name=req.name, host_config=config,
                             networking_config=networking, working_dir=req.workdir or None, detach=True,
                             user=req.user or None)
        cid = created["Id"]
        self._call(f"container {req.name}", api.start, cid)
        return cid

    def container(self, ref: str) -> ContainerView | None:
        try:
            c = self._client.containers.get(ref)
        except docker.errors.NotFound:
            return None
        except (docker.errors.DockerException, *_UNREACHABLE) as e:
            raise Unavailable(f"the docker engine at {self.url or 'DOCKER_HOST'} is unreachable: {e}") from None
        return _view(c.attrs)

    def containers(self, labels: dict[str, str]) -> list[ContainerView]:
        found = self._call("containers", self._client.containers.list, all=True,
                           filters={"label": label_filter(labels)})
        return [_view(c.attrs) for c in found]

    def signal(self, ref: str, sig: str) -> bool:
        try:
            self._client.api.kill(ref, signal=sig)
            return True
        except docker.errors.APIError:
            return False  # gone, or not running any more

    def wait(self, ref: str, timeout: float | None = None) -> int:
        result = self._call(f"container {ref}", self._client.api.wait, ref, timeout=timeout)
        return int(result.get("StatusCode", -1))

    def logs(self, ref: str, *, stdout: bool, stderr: bool) -> Iterator[bytes]:
        """The container's output from its start, following it until it ends."""
        return self._call(f"container {ref}", self._client.api.logs, ref, stream=True, follow=True,
                          stdout=stdout, stderr=stderr)

    def remove_container(self, ref: str) -> bool:
        try:
            self._client.api.remove_container(ref, force=True, v=True)
            return True
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as e:
            if e.status_code == 409:  # removal already in progress
                return False
            raise TrainforgeError(f"container {ref}: {e.explanation or e}") from None

    def remove_containers(self, labels: dict[str, str]) -> int:
        found = self.containers(labels)
        for c in found:
            self.remove_container(c.id)
        return sum(c.running for c in found)

    def volumes(self, labels: dict[str, str]) -> list[str]:
        return [v.name for v in self._call("volumes", self._client.volumes.list,
                                           filters={"label": label_filter(labels)})]

    def close(self) -> None:
        self._client.close()


def _view(attrs: dict) -> ContainerView:
    state = attrs.get("State") or {}
    host = attrs.get("HostConfig") or {}
    return ContainerView(id=attrs["Id"], name=attrs.get("Name", "").lstrip("/"), status=state.get("Status", ""),
                         labels=(attrs.get("Config") or {}).get("Labels") or {},
                         nano_cpus=int(host.get("NanoCpus") or 0), memory=int(host.get("Memory") or 0),
                         exit_code=int(state.get("ExitCode") or 0), oom_killed=bool(state.get("OOMKilled")),
                         error=state.get("Error") or "", pid=int(state.get("Pid") or 0))

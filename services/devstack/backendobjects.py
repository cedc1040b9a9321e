"""`trainforge down`'s last step: remove what the stack's backend created outside this machine's processes
(docker containers and networks, kubernetes attempts), each found by the stack's label, and what the local
backend's sandbox made for jobs whose stop never came (network namespaces, cgroups)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainforge_services.common import isolation
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.settings import LcmSettings
from trainforge_services.devstack.components import ComponentStatus, Status


def remove_backend_objects(stack_id: str, done: Callable[[ComponentStatus], None]) -> None:
    """What the LCM's backend made for the stack and a stopped process may leave behind: with the docker
    backend every container and network labelled with the stack (a learner whose runner was stopped with its
    controller leaves its container to this), with the kubernetes backend the stack's attempts."""
    settings = LcmSettings()
    if settings.backend == "kubernetes":
        _remove_pods(settings, stack_id, done)
        return
    if settings.backend != "docker":
        return
    from trainforge_services.common.adapters.docker_engine import Engine

    try:
        engine = Engine(settings.docker_url)
        try:
            removed = engine.remove_containers({"tf.stack": stack_id})
            engine.remove_networks({"tf.stack": stack_id})
        finally:
            engine.close()
    except TrainforgeError as e:
        done(ComponentStatus("docker containers", None, settings.docker_url, Status.UNHEALTHY, e.message))
        return
    if removed:
        done(ComponentStatus("docker containers", None, settings.docker_url, Status.STOPPED,
                             f"{removed} removed"))


def _remove_pods(settings: LcmSettings, stack_id: str, done: Callable[[ComponentStatus], None]) -> None:
    """With the kubernetes backend: delete the stack's attempts (their root ConfigMaps, whose owned objects the
    garbage collector removes) and, should an owner reference have missed one, their pods."""
    from trainforge_services.common.adapters.kube import Kube

    selector = f"app.kubernetes.io/managed-by=trainforge,tf.stack={stack_id},tf.job"
    where = settings.kube_config or "in-cluster"
    try:
        kube = Kube(settings.kube_config, settings.kube_context)
        try:
            roots = kube.list("ConfigMap", None, selector)
            for root in roots:
                kube.delete("ConfigMap", root["metadata"]["namespace"], root["metadata"]["name"])
            for ns in {p["metadata"]["namespace"] for p in kube.list("Pod", None, selector)}:
                kube.delete_all("Pod", ns, selector)
        finally:
            kube.close()
    except TrainforgeError as e:
        done(ComponentStatus("kubernetes attempts", None, where, Status.UNHEALTHY, e.message))
        return
    if roots:
        done(ComponentStatus("kubernetes attempts", None, where, Status.STOPPED, f"{len(roots)} removed"))


def remove_job_isolation(work: Path, done: Callable[[ComponentStatus], None]) -> None:
    """With the local backend: the network namespace and learner cgroups of each job under `work` (the LCM's
    job folders) that are still there. The LCM removes them when it stops a job; a job whose learners were
    still running at `down` (or whose LCM died first) never got that stop, and nothing else would remove
    them. Called once the stack's processes are gone."""
    try:
        jobs = sorted(p.name for p in work.iterdir() if p.is_dir())
    except OSError:
        return
    left = [job for job in jobs if isolation.left_behind(job)]
    if not left:
        return
    stuck = [job for job in left if not isolation.remove_job(job)]
    if stuck:
        done(ComponentStatus("learner isolation", None, str(work), Status.UNHEALTHY,
                             f"could not remove the network namespace or cgroups of {len(stuck)} job(s): "
                             f"{', '.join(stuck[:5])}{' ...' if len(stuck) > 5 else ''}"))
    else:
        done(ComponentStatus("learner isolation", None, str(work), Status.STOPPED,
                             f"network namespaces and cgroups of {len(left)} job(s) removed"))

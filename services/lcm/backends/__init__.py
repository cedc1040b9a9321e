"""Backends are chosen by settings, here and nowhere else.

Only this function names the backend modules, so a backend whose client
library is missing cannot break an LCM configured for another one. The
interface every backend implements (Backend, AttemptPlan, Handle, ...) lives
in base.py alone.
"""

from __future__ import annotations

from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.settings import LcmSettings
from trainforge_services.lcm.backends.base import Backend

__all__ = ["make_backend"]


def make_backend(settings: LcmSettings) -> Backend:
    """The backend `settings.backend` names; InvalidArgument for one this build does not have."""
    if settings.backend == "local":
        from trainforge_services.lcm.backends.local import LocalBackend

        return LocalBackend(settings)
    if settings.backend == "docker":
        from trainforge_services.lcm.backends.docker import DockerBackend

        return DockerBackend(settings)
    if settings.backend == "kubernetes":
        from trainforge_services.lcm.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend(settings)
    if settings.backend == "simulated":  # scale tests only: jobs run for a set time, no process
        from trainforge_services.lcm.backends.simulated import SimulatedBackend

        return SimulatedBackend(settings)
    raise InvalidArgument(f"backend {settings.backend} is not available in this build",
                          details=[{"field": "backend", "message": "not available in this build; use local, docker, kubernetes or simulated"}])

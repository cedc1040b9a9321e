"""The local backend: controllers and job monitors as processes on this machine (see `backend.py`)."""

from trainforge_services.lcm.backends.local.backend import KILL_GRACE, LocalBackend
from trainforge_services.lcm.backends.local.processes import child_env, detect_gpus

__all__ = ["KILL_GRACE", "LocalBackend", "child_env", "detect_gpus"]

"""The docker backend: learners' commands in containers on a Docker engine (see `backend.py`)."""

from trainforge_services.lcm.backends.docker.backend import DockerBackend

__all__ = ["DockerBackend"]

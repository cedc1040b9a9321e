"""What a deploy carries that the job record does not: the team secrets a job's env names and the objects
it may read, both resolved at deploy time and handed to the LCM with that one call.

Secrets: the Trainer already reads MongoDB and is the one caller of
DeployJob, so the values travel exactly once - Trainer memory, the gRPC
request (`DeployJobRequest.secret_env`), the LCM's memory, the learner's
0600 spec file, the learner's environment - and are never written to the
job record, etcd, a log line or an API response. Neither the LCM nor the
controller needs a database (a future sandboxed controller cannot reach
one), and a secret changed between attempts is picked up by the next one.

Reads: the store-reference rule is applied again (services/trainer/
storerefs.py), so a publication withdrawn since the submit refuses the
deploy, and the keys granted go to the controllers (`DeployJobRequest.reads`),
which fetch nothing else but the job's own objects.

`ResolvingLcm` wraps the real `Lcm`, so the dispatcher knows neither: a job
whose manifest names no secret and no object is deployed exactly as before,
and a missing secret or a refused reference fails the deploy (so the job)
with a message naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from trainforge_services.common.manifest import Manifest, parse_manifest
from trainforge_services.trainer.lcm_client import Lcm
from trainforge_services.trainer.resources import BackendSize, Quota

# reveal(team, names) -> name -> value; NotFound naming the missing ones
Reveal = Callable[[str, set[str]], dict[str, str]]


class Reads(Protocol):
    """StoreRefs.reads: the keys a job may read beyond its own, or PermissionDenied."""

    def __call__(self, team: str, manifest: Manifest, *, job_id: str = "", code_uri: str = "") -> list[str]: ...


class ResolvingLcm:
    def __init__(self, inner: Lcm, reveal: Reveal, reads: Reads):
        self._inner = inner
        self._reveal = reveal
        self._reads = reads

    def deploy_job(self, job_id: str, team: str, attempt: int, manifest_json: str, code_uri: str,
                   checkpoint_uri: str = "", **options: bool) -> list[str]:
        """`options`: the Lcm's keyword options (`gated`), passed on as they came."""
        manifest = parse_manifest(manifest_json)
        resolved: dict = {}
        if reads := self._reads(team, manifest, job_id=job_id, code_uri=code_uri):
            resolved["reads"] = reads
        if refs := manifest.secret_env():
            values = self._reveal(team, set(refs.values()))
            resolved["secret_env"] = {var: values[name] for var, name in refs.items()}
        return self._inner.deploy_job(job_id, team, attempt, manifest_json, code_uri, checkpoint_uri,
                                      **resolved, **options)

    def open_gate(self, job_id: str, attempt: int) -> None:
        self._inner.open_gate(job_id, attempt)

    def kill_job(self, job_id: str, reason: str = "", attempt: int = 0) -> int:
        return self._inner.kill_job(job_id, reason, attempt)

    def halt_job(self, job_id: str, attempt: int) -> None:
        self._inner.halt_job(job_id, attempt)

    def grow_job(self, job_id: str, attempt: int, learners: int) -> bool:
        return self._inner.grow_job(job_id, attempt, learners)

    def get_capacity(self) -> BackendSize:
        return self._inner.get_capacity()

    def sync_team(self, team: str, quota: Quota) -> bool:
        return self._inner.sync_team(team, quota)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

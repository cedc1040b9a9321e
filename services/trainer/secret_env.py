"""The team secrets a job's env names, resolved at deploy time and handed to the LCM with that one call.

Why here: the Trainer already reads MongoDB and is the one caller of
DeployJob, so the values travel exactly once - Trainer memory, the gRPC
request (`DeployJobRequest.secret_env`), the LCM's memory, the learner's
0600 spec file, the learner's environment - and are never written to the
job record, etcd, a log line or an API response. Neither the LCM nor the
controller needs a database (a future sandboxed controller cannot reach
one), and a secret changed between attempts is picked up by the next one.

`SecretResolvingLcm` wraps the real `Lcm`, so the dispatcher does not know
secrets exist: a job whose manifest names none is deployed exactly as
before, and a missing secret fails the deploy (so the job) with a message
naming it.
"""

from __future__ import annotations

from collections.abc import Callable

from trainforge_services.common.manifest import parse_manifest
from trainforge_services.trainer.admission import Capacity, Quota
from trainforge_services.trainer.lcm_client import Lcm

# reveal(team, names) -> name -> value; NotFound naming the missing ones
Reveal = Callable[[str, set[str]], dict[str, str]]


class SecretResolvingLcm:
    def __init__(self, inner: Lcm, reveal: Reveal):
        self._inner = inner
        self._reveal = reveal

    def deploy_job(self, job_id: str, team: str, attempt: int, manifest_json: str, code_uri: str,
                   checkpoint_uri: str = "", **options: bool) -> list[str]:
        """`options`: the Lcm's keyword options (`gated`), passed on as they came."""
        refs = parse_manifest(manifest_json).secret_env()
        if not refs:
            return self._inner.deploy_job(job_id, team, attempt, manifest_json, code_uri, checkpoint_uri, **options)
        values = self._reveal(team, set(refs.values()))
        return self._inner.deploy_job(job_id, team, attempt, manifest_json, code_uri, checkpoint_uri,
                                      secret_env={var: values[name] for var, name in refs.items()}, **options)

    def open_gate(self, job_id: str, attempt: int) -> None:
        self._inner.open_gate(job_id, attempt)

    def kill_job(self, job_id: str, reason: str = "", attempt: int = 0) -> int:
        return self._inner.kill_job(job_id, reason, attempt)

    def halt_job(self, job_id: str, attempt: int) -> None:
        self._inner.halt_job(job_id, attempt)

    def grow_job(self, job_id: str, attempt: int, learners: int) -> bool:
        return self._inner.grow_job(job_id, attempt, learners)

    def get_capacity(self) -> Capacity:
        return self._inner.get_capacity()

    def sync_team(self, team: str, quota: Quota) -> bool:
        return self._inner.sync_team(team, quota)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

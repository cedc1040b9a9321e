"""An `Lcm` (services/trainer/lcm_client.py) that takes every call and runs nothing.

For tests of the Trainer and what stands on it (API, dashboard, usage, webhooks) where no learner needs to
run: jobs stay DEPLOYING until the test reports for them as a job monitor would.
"""

from __future__ import annotations

from trainforge_services.trainer.resources import BackendSize, Quota, Usage


class IdleLcm:
    def __init__(self, capacity: Usage, network_policy: str = ""):
        self.capacity = BackendSize(capacity, "fake", network_policy)
        self.grants: list[tuple[str, int, int]] = []  # (job, attempt, learners) granted, oldest first

    def deploy_job(self, *args: object, **kwargs: object) -> list[str]:
        return ["pid:1"]

    def kill_job(self, job_id: str, reason: str = "", attempt: int = 0) -> int:
        return 0

    def halt_job(self, job_id: str, attempt: int) -> None:
        return None

    def open_gate(self, job_id: str, attempt: int) -> None:
        return None

    def grow_job(self, job_id: str, attempt: int, learners: int) -> bool:
        self.grants.append((job_id, attempt, learners))
        return True

    def get_capacity(self) -> BackendSize:
        return self.capacity

    def sync_team(self, team: str, quota: Quota) -> bool:
        return False  # it keeps no copy of quotas

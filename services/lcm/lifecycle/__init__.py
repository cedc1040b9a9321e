"""The LCM's lifecycle: it owns every job attempt; backends only launch, stop, observe and report capacity.

    plan.py        deployment_from_request (-> JobDeployment, the validated request) and build_plan -> AttemptPlan
    records.py     AttemptRecord, persisted per job (<state_dir>/lcm/jobs/<job>.json)
    core.py        Lifecycle: deploy / kill / halt / capacity, idempotency, replacement, reconcile
    supervision.py dead monitors restarted, lost controllers reported
"""

from trainforge_services.lcm.backends.base import JobDeployment
from trainforge_services.lcm.lifecycle.core import Lifecycle
from trainforge_services.lcm.lifecycle.plan import (
           build_plan,
           check_attempt,
           deployment_from_request,
           team_quota_from_proto,
)
from trainforge_services.lcm.lifecycle.records import AttemptRecord
from trainforge_services.lcm.lifecycle.types import RunningJob

__all__ = ["AttemptRecord", "JobDeployment", "Lifecycle", "RunningJob", "build_plan", "check_attempt",
           "deployment_from_request", "team_quota_from_proto"]

"""The LCM's lifecycle: it owns every job attempt; backends only launch, stop, observe and report capacity.

    plan.py        deployment_from_request (-> JobDeployment, the validated request) and build_plan -> AttemptPlan
    records.py     AttemptRecord, persisted per job (<state_dir>/lcm/jobs/<job>.json)
    core.py        LifecycleManager: deploy / kill / halt / capacity, idempotency, replacement, reconcile
    marks.py       KilledMarks: the highest attempt of each job removed, kept in etcd for a while
    supervision.py dead monitors restarted, lost controllers reported
    elastic.py     Growth: elastic attempts grown into the learners the Trainer granted
"""

from trainforge_services.lcm.backends.base import JobDeployment
from trainforge_services.lcm.lifecycle.core import LifecycleManager
from trainforge_services.lcm.lifecycle.plan import (
           build_plan,
           check_attempt,
           deployment_from_request,
           team_quota_from_proto,
)
from trainforge_services.lcm.lifecycle.records import AttemptRecord
from trainforge_services.lcm.lifecycle.types import RunningJob

__all__ = ["AttemptRecord", "JobDeployment", "LifecycleManager", "RunningJob", "build_plan", "check_attempt",
           "deployment_from_request", "team_quota_from_proto"]

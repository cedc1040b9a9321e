"""Which isolation a learner gets: the admin's setting against what this machine allows.

TF_ISOLATION=auto (the default) sandboxes where the kernel and privileges
allow it (as root: `sandbox`; without root, in user namespaces: `userns`) and otherwise runs the learner with isolation `none`, saying why;
`sandbox` requires it; `none` turns it off. TF_REQUIRE_ISOLATION=true
refuses to run a learner without a sandbox, with the reason in its status.
What the sandbox needs of the machine is `trainforge_services.common.isolation.unavailable`.
Its egress is the admin's TF_EGRESS narrowed by the team's own policy, which
the spec carries (trainforge_services.common.egress.effective); a policy that is
invalid or whose forwarders cannot be set up refuses the learner rather
than run it without a sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainforge_services.common import egress
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.isolation import Isolation, kind, unavailable
from trainforge_services.common.relay import egress_env
from trainforge_services.common.settings import ControllerSettings

from .box import Sandbox
from .egress import EgressError


@dataclass(frozen=True)
class Decision:
    isolation: Isolation
    reason: str = ""  # why not a sandbox, when not
    refused: str = ""  # set when the learner must not run at all


def decide(setting: str, require: bool, why_not: str | None = None) -> Decision:
    """The isolation for a learner under TF_ISOLATION=`setting` and TF_REQUIRE_ISOLATION=`require`."""
    if setting == "none":
        reason = "TF_ISOLATION=none"
    else:
        reason = unavailable() if why_not is None else why_not
        if not reason:
            return Decision(kind())
        if setting == "sandbox":
            return Decision(Isolation.NONE, reason, f"TF_ISOLATION=sandbox but no sandbox is possible: {reason}")
    if require:
        return Decision(Isolation.NONE, reason,
                        f"this platform refuses learners without a sandbox (TF_REQUIRE_ISOLATION) and {reason}")
    return Decision(Isolation.NONE, reason)


@dataclass(frozen=True)
class Chosen:
    """What `choose` decided: the set-up sandbox or None, the isolation, a line for the log, a refusal."""

    sandbox: Sandbox | None
    isolation: Isolation
    note: str = ""
    refused: str = ""


def allowed_egress(spec: LearnerSpec, settings: ControllerSettings) -> egress.Policy:
    """The admin's TF_EGRESS narrowed by the team's own policy; ValueError naming an invalid one."""
    team = egress.parse(spec.egress, f"team {spec.team}'s egress policy") if spec.egress else None
    return egress.effective(egress.parse(settings.egress, "TF_EGRESS"), team)


def store_endpoint(settings: ControllerSettings) -> str:
    """The object store's S3 endpoint, which `store` reaches ("" when the objects are files)."""
    return settings.s3_endpoint if settings.objectstore().startswith("s3://") else ""


def container_egress(spec: LearnerSpec, settings: ControllerSettings) -> dict[str, str]:
    """The environment a backend's launcher gets, which relays the job's egress into its container itself (the
    docker backend's runner): TF_EGRESS the policy the job gets, AWS_ENDPOINT_URL where `store` reaches.
    ValueError naming an invalid policy."""
    return egress_env(allowed_egress(spec, settings), store_endpoint(settings))


def choose(spec: LearnerSpec, settings: ControllerSettings, *, python: str) -> Chosen:
    """Decide and, for a sandbox, set it up; a sandbox that cannot be set up degrades like a missing one."""
    decision = decide(settings.isolation, settings.require_isolation)
    if decision.isolation in (Isolation.SANDBOX, Isolation.USERNS):
        try:
            allowed = allowed_egress(spec, settings)
        except ValueError as e:
            return Chosen(None, Isolation.NONE, refused=str(e))
        sandbox = Sandbox(spec, settings.state_dir, python=python, egress=allowed,
                          store_endpoint=store_endpoint(settings), unprivileged=decision.isolation is Isolation.USERNS)
        try:
            sandbox.prepare()
            return Chosen(sandbox, decision.isolation, note="" if allowed.none else f"egress: {allowed}")
        except EgressError as e:
            sandbox.cleanup()
            return Chosen(None, Isolation.NONE, refused=f"the learner's egress could not be set up: {e}")
        except OSError as e:
            sandbox.cleanup()
            why = f"setting up the sandbox failed: {e.strerror or e}" if e.strerror else f"setting up the " \
                  f"sandbox failed: {e}"
            decision = decide(settings.isolation, settings.require_isolation, why_not=why)
    if decision.refused:
        return Chosen(None, Isolation.NONE, refused=decision.refused)
    return Chosen(None, Isolation.NONE, note=f"isolation: none ({decision.reason})")

"""Who may read what in the object store: the rule for every `store://` reference a job makes.

The platform fetches a job's references (its `data:` sources, its code
archive, the checkpoint it resumes from, the outputs a workflow node takes
from upstream) with its own object-store credentials, so the platform must
check the tenant's rights on each one; the store itself would let it read
anything. A team may read:

- its own objects: `jobs/<job>/...` of its jobs (outputs, checkpoints, logs,
  code) and `experiments/<id>/...` of its experiments and workflows;
- prefixes a platform admin published to it or to every team
  (`store://datasets/mnist/`), which never lie under `jobs/` or
  `experiments/`.

Anything else is refused, naming the reference and the rule: another team's
job, `store://jobs/` (every team's jobs), `store://` itself. The Trainer
applies the rule at submit and again at each deploy, and hands the learners
the key prefixes it granted (`LearnerSpec.reads`); the controller fetches
nothing outside them (`covered`). Ownership comes from the caller through
`Owners`, so this module stays free of any store.

Prefixes match on whole path segments: `datasets/mnist/` grants
`datasets/mnist/train.pt`, never `datasets/mnist-private/`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from trainforge_services.common.contracts.storekeys import SCHEME, key_from_uri, uri_for_prefix
from trainforge_services.common.errors import InvalidArgument, PermissionDenied

# key roots whose objects belong to one job or one experiment (or workflow) each: never published
OWNED_ROOTS = ("jobs", "experiments")
EVERYONE = "*"
_TEAM = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
RULE = ("a job may read its own team's jobs and experiments (store://jobs/<id>/..., store://experiments/<id>/...) "
        "and prefixes a platform admin published to its team or to everyone")


class Owners(Protocol):
    """The team that owns a job or an experiment (or workflow); None when there is none of that id."""

    def job_team(self, job_id: str) -> str | None: ...

    def experiment_team(self, experiment_id: str) -> str | None: ...


@dataclass(frozen=True)
class Publication:
    """A key prefix (ending in '/') a platform admin lets some teams, or every team, read."""

    prefix: str
    teams: frozenset[str]  # EVERYONE in it: every team

    def visible_to(self, team: str) -> bool:
        return EVERYONE in self.teams or team in self.teams

    @property
    def uri(self) -> str:
        return uri_for_prefix(self.prefix)


def check_key(key: str, what: str) -> str:
    """`key` with every path segment non-empty and neither '.' nor '..' (a local store would resolve them)."""
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts) or "\\" in key:
        raise InvalidArgument(f"{what}: {SCHEME}{key} has an empty, '.' or '..' path segment",
                              details=[{"field": what, "message": "invalid key"}])
    return key


def publication_prefix(uri: str) -> str:
    """The key prefix (with its trailing '/') an admin may publish, or InvalidArgument saying why not."""
    try:
        key = check_key(key_from_uri(uri), "prefix")
    except InvalidArgument as e:
        raise InvalidArgument(f"prefix: {e.message}", details=[{"field": "prefix", "message": e.message}]) from None
    if key.split("/", 1)[0] in OWNED_ROOTS:
        message = (f"{uri} lies under store://{key.split('/', 1)[0]}/, whose objects belong to one team's job or "
                   "experiment each; it cannot be published")
        raise InvalidArgument(f"prefix: {message}", details=[{"field": "prefix", "message": message}])
    return key + "/"


def publication_teams(teams: Iterable[str]) -> frozenset[str]:
    out = frozenset(t.strip() for t in teams if t.strip())
    bad = [t for t in out if t != EVERYONE and not _TEAM.match(t)]
    if bad or not out:
        message = f"{', '.join(sorted(bad))} is not a team name" if bad else "name at least one team, or '*'"
        raise InvalidArgument(f"teams: {message}", details=[{"field": "teams", "message": message}])
    return out


def under(key: str, prefix: str) -> bool:
    """Whether `key` is `prefix` itself (without its '/') or lies below it, on whole segments."""
    prefix = prefix.rstrip("/")
    return key == prefix or key.startswith(prefix + "/")


def covered(key: str, grants: Iterable[str]) -> bool:
    return any(under(key, g) for g in grants)


def _refuse(field: str, uri: str, team: str, why: str) -> PermissionDenied:
    message = f"{field}: team {team} may not read {uri}: {why} ({RULE})"
    return PermissionDenied(message, details=[{"field": field, "message": why, "source": uri, "rule": RULE}])


def grant(team: str, uri: str, field: str, owners: Owners, publications: Iterable[Publication]) -> str:
    """The key `uri` names when `team` may read it (the prefix the learners are granted); else PermissionDenied
    naming `field`, the reference and the rule. A malformed URI is InvalidArgument naming `field`."""
    if uri.startswith(SCHEME) and not uri[len(SCHEME):].strip("/"):
        raise _refuse(field, uri, team, "it names the whole object store, every team's objects")
    try:
        key = check_key(key_from_uri(uri), field)
    except InvalidArgument as e:
        raise InvalidArgument(f"{field}: {e.message}", details=[{"field": field, "message": e.message}]) from None
    root, _, rest = key.partition("/")
    if root in OWNED_ROOTS:
        owned_id = rest.split("/", 1)[0]
        if not owned_id:
            raise _refuse(field, uri, team, f"it names every team's {root}")
        owner = owners.job_team(owned_id) if root == "jobs" else owners.experiment_team(owned_id)
        if owner != team:  # another team's, or none at all: the same answer, so ids cannot be probed
            kind = "a job" if root == "jobs" else "an experiment or workflow"
            raise _refuse(field, uri, team, f"{owned_id} is not {kind} of team {team}")
        return key
    visible = [p for p in publications if p.visible_to(team)]
    if any(under(key, p.prefix) for p in visible):
        return key
    shown = ", ".join(sorted(p.uri for p in visible)) or "none"
    raise _refuse(field, uri, team, f"it is not under a prefix published to team {team} (published to it: {shown})")


"""The Trainer's side of the store-reference rule (services/common/storeaccess.py): owners, publications, grants.

`StoreRefs.reads` answers, for one job, the key prefixes its learners may
read besides the job's own `jobs/<id>/` (its code archive when that is an
experiment's, each `data:` source), or PermissionDenied naming the first
reference the team may not read. The Trainer asks it at submit (of a job, an
experiment's template, each workflow node's) and again at every deploy, whose
request carries the answer to the controllers (`DeployJobRequest.reads`): a
publication withdrawn since the submit is refused at the next deploy.

Publications live in their own small collection, one document per prefix,
written by platform admins through SetPublication.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from trainforge_services.common.adapters.mongo import Database, mapped_as
from trainforge_services.common.contracts.storekeys import job_prefix, key_from_uri
from trainforge_services.common.errors import NotFound
from trainforge_services.common.manifest import Manifest
from trainforge_services.common.storeaccess import (
    Publication,
    grant,
    publication_prefix,
    publication_teams,
    under,
)

PUBLICATIONS = "publications"
mapped = mapped_as("publication store")


class StoreOwners:
    """Which team owns a job, an experiment or a workflow, read from the Trainer's own collections."""

    def __init__(self, db: Database, *, jobs: str, experiments: str, workflows: str):
        self._jobs, self._experiments, self._workflows = db[jobs], db[experiments], db[workflows]

    @mapped
    def job_team(self, job_id: str) -> str | None:
        doc = self._jobs.find_one({"_id": job_id}, {"team": 1})
        return None if doc is None else doc.get("team")

    @mapped
    def experiment_team(self, experiment_id: str) -> str | None:
        # a workflow's code lies under experiments/<workflow id>/ like an experiment's
        for col in (self._experiments, self._workflows):
            doc = col.find_one({"_id": experiment_id}, {"team": 1})
            if doc is not None:
                return doc.get("team")
        return None


class Publications:
    def __init__(self, db: Database, collection: str = PUBLICATIONS):
        self._docs = db[collection]

    @mapped
    def put(self, prefix_uri: str, teams: Iterable[str], actor: str) -> Publication:
        """Publish a prefix to these teams ('*': every team), replacing whom it was published to."""
        pub = Publication(publication_prefix(prefix_uri), publication_teams(teams))
        self._docs.replace_one({"_id": pub.prefix}, {"_id": pub.prefix, "teams": sorted(pub.teams),
                                                     "actor": actor, "updated_at": time.time()}, upsert=True)
        return pub

    @mapped
    def remove(self, prefix_uri: str) -> None:
        prefix = publication_prefix(prefix_uri)
        if self._docs.delete_one({"_id": prefix}).deleted_count == 0:
            raise NotFound(f"{prefix_uri} is not published")

    @mapped
    def all(self) -> list[Publication]:
        return [Publication(d["_id"], frozenset(d.get("teams") or ())) for d in self._docs.find().sort("_id", 1)]


class StoreRefs:
    def __init__(self, owners: StoreOwners, publications: Publications):
        self._owners = owners
        self.publications = publications

    def reads(self, team: str, manifest: Manifest, *, job_id: str = "", code_uri: str = "",
              field: str = "") -> list[str]:
        """The keys the job may read beyond its own prefix, sorted; PermissionDenied (naming the field, the
        source and the rule) or InvalidArgument (a malformed URI) for the first one it may not."""
        refs = [(f"{field}data[{i}].source", d.source) for i, d in enumerate(manifest.data)]
        if code_uri and not (job_id and under(key_from_uri(code_uri), job_prefix(job_id))):
            refs.insert(0, ("code_uri", code_uri))
        if not refs:
            return []
        published = self.publications.all()
        return sorted({grant(team, uri, where, self._owners, published) for where, uri in refs})

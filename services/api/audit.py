"""The audit log: who changed what, when, and how it ended, in MongoDB (`audit`).

`AuditMiddleware` sits around the whole app and writes one entry for every
request whose method changes state (POST, PUT, PATCH, DELETE), whether it
succeeded, was refused (401, 403, 404, 422, 429) or failed; a route added
later is covered without doing anything. An entry names the caller (key id,
team, role, and whether a key or a token was used; empty when the request
was not authenticated), the method, the route template
(`/v1/jobs/{job_id}/cancel`), the concrete path, the target (the route's
path parameter, or what the route names with `note_target`, e.g. the id of
the job it created), and the HTTP status. A request refused because it named
something the platform will not reach for the tenant (a requirement line
that is an installer option, a webhook to the platform's own network:
services/common/errors.RefusedReference) also gets `refused`: for each
reference its field, its source (the file and line, or the URL) and the
rule it broke - so the entry names the team, the key and the source.

The entry is written before the response's status line goes out, so by the
time a client sees the answer the entry is in the store. A failure to write
it is logged and does not change the answer: the change it describes has
already happened. Request bodies and headers are never recorded.

Entries are written as a group commit: the requests that finish while one
write is in flight are stored together by the next `insert_many`, and each
waits until the write holding its entry returned. In a burst of submits that
is one store round trip for many requests instead of one each; a lone
request is written at once, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import anyio.to_thread
from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainforge_services.common.adapters import mongo
from trainforge_services.common.adapters.mongo import DESCENDING, Database, InvalidId, ObjectId, PyMongoError
from trainforge_services.common.errors import InvalidArgument, PermissionDenied, RefusedReference

log = logging.getLogger(__name__)

COLLECTION = "audit"
GATEWAY_PREFIX = "/internal/gateway/"
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_TARGET_PARAMS = ("job_id", "key_id", "team")


def refusals_of(exc: Exception) -> list[dict]:
    """What a refused request named that the platform will not reach for its team ({field, source, rule} each):
    a RefusedReference's refusals, or the details of a PermissionDenied that name a source (a `store://`
    reference the team may not read, services/common/storeaccess.py)."""
    if isinstance(exc, RefusedReference):
        return exc.refusals
    if isinstance(exc, PermissionDenied):
        return [d for d in exc.details if d.get("source")]
    return []


def note_target(request: Request, target: str, *, team: str | None = None) -> None:
    """Name what a request created or changed when its path does not (e.g. a new job's id)."""
    request.state.audit_target = target
    if team is not None:
        request.state.audit_target_team = team


def note_refused(request: Request, refusals: list[dict]) -> None:
    """Record in the request's audit entry which references were refused ({field, source, rule} each)."""
    if refusals:
        request.state.audit_refused = [{k: str(r.get(k, ""))[:300] for k in ("field", "source", "rule")}
                                   for r in refusals[:20]]


class AuditLog:
    def __init__(self, db: Database, collection: str = COLLECTION):
        self._entries = db[collection]

    def record(self, entry: dict) -> None:
        try:
            self._entries.insert_one(dict(entry))
        except PyMongoError as e:
            raise mongo.translate(e, "audit log") from None

    def record_many(self, entries: list[dict]) -> None:
        """Store several entries in one round trip (unordered: one bad entry does not keep out the rest)."""
        try:
            self._entries.insert_many([dict(e) for e in entries], ordered=False)
        except PyMongoError as e:
            raise mongo.translate(e, "audit log") from None

    def query(self, *, team: str | None = None, since: float | None = None, limit: int = 100,
              until: float | None = None, before: tuple[float, str] | None = None) -> list[dict]:
        """Newest first (then by id). `team` matches entries made by the team's keys and entries about the
        team; `before` is the last (ts, id) of the previous page."""
        clauses: list[dict] = []
        if team is not None:
            clauses.append({"$or": [{"team": team}, {"target_team": team}]})
        ts: dict = {}
        if since is not None:
            ts["$gte"] = since
        if until is not None:
            ts["$lt"] = until
        if ts:
            clauses.append({"ts": ts})
        if before is not None:
            clauses.append({"$or": [{"ts": {"$lt": before[0]}},
                                    {"ts": before[0], "_id": {"$lt": _object_id(before[1])}}]})
        where: dict = {"$and": clauses} if len(clauses) > 1 else (clauses[0] if clauses else {})
        try:
            docs = list(self._entries.find(where).sort([("ts", DESCENDING), ("_id", DESCENDING)]).limit(limit))
        except PyMongoError as e:
            raise mongo.translate(e, "audit log") from None
        return [_public(d) for d in docs]


def _object_id(text: str) -> ObjectId:
    try:
        return ObjectId(text)
    except (InvalidId, TypeError):
        raise InvalidArgument("cursor: not a cursor this API returned",
                              details=[{"field": "cursor", "message": "invalid"}]) from None


def _public(doc: Mapping) -> dict:
    out = {k: v for k, v in doc.items() if k != "_id"}
    out["id"] = str(doc["_id"])
    return out


def entry_for(scope: Scope, status: int, now: float) -> dict:
    """The audit entry of a finished request, from what routing and authentication left in its scope."""
    state = scope.get("state") or {}
    tenant = state.get("tenant")
    route = scope.get("route")
    params = scope.get("path_params") or {}
    target = state.get("audit_target") or next((str(params[p]) for p in _TARGET_PARAMS if p in params), "")
    team = tenant.team if tenant is not None else ""
    refused = state.get("audit_refused")
    return {**({"refused": refused} if refused else {}),
        "ts": now,
        "key_id": tenant.key_id if tenant is not None else "",
        "team": team,
        "role": tenant.role.value if tenant is not None else "",
        "via": tenant.via if tenant is not None else "",
        "method": scope.get("method", ""),
        "route": getattr(route, "path", "") or "",
        "path": scope.get("path", "")[:512],
        "target": str(target)[:256],
        "target_team": str(state.get("audit_target_team") or params.get("team") or team)[:64],
        "status": status,
    }


class AuditMiddleware:
    def __init__(self, app: ASGIApp, audit: AuditLog):
        self.app = app
        self.audit = audit
        # entries waiting for the next write, each with the future its request awaits (group commit)
        self._waiting: list[tuple[dict, asyncio.Future]] = []
        self._writer: asyncio.Task | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # a job's controller writing through the job gateway changes no tenant's state: not audited
        if (scope["type"] != "http" or scope.get("method") not in STATE_CHANGING
                or scope.get("path", "").startswith(GATEWAY_PREFIX)):
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})
        recorded = False

        async def recording_send(message: Message) -> None:
            nonlocal recorded
            if message["type"] == "http.response.start" and not recorded:
                recorded = True
                await self._record(entry_for(scope, message["status"], time.time()))
            await send(message)

        await self.app(scope, receive, recording_send)

    async def _record(self, entry: dict) -> None:
        """Return once the entry is stored (or its write failed, which is logged)."""
        loop = asyncio.get_running_loop()
        if self._writer is not None and self._writer.get_loop() is not loop:
            self._writer, self._waiting = None, []  # an app served again on another loop: that one is gone
        written = loop.create_future()
        self._waiting.append((entry, written))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_waiting())
        await asyncio.shield(written)  # a client gone meanwhile does not cancel the others' write

    async def _write_waiting(self) -> None:
        """Write what waits, one `insert_many` at a time, until nothing does; then end."""
        while self._waiting:
            batch, self._waiting = self._waiting, []
            entries = [entry for entry, _ in batch]
            try:
                await anyio.to_thread.run_sync(self.audit.record_many, entries)
            except Exception:  # noqa: BLE001 - the change is done; a lost entry must not turn it into an error
                for entry in entries:
                    log.exception("could not write the audit entry %s", entry)
            for _, written in batch:
                if not written.done():
                    written.set_result(None)

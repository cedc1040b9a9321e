"""Webhook notifications: each team's default hook and signing secret, the delivery outbox, the signature.

A job's terminal and HALTED states are announced to the manifest's
`notify: {webhook: URL}` and to its team's default webhook. The Trainer
enqueues one outbox document per (job, event, URL) - its id is derived from
them, so enqueueing the same event twice (a rule and a restart's
reconciliation) adds nothing - and its delivery worker (services/trainer/
notifier.py) POSTs it until the receiver answers 2xx, with backoff, or
gives up after `max_tries`. Each attempt is recorded in the document, which
is what `GET /v1/jobs/{id}/notifications` and the admins' listing show. The
outbox lives in MongoDB, so a Trainer restart loses no delivery.

Signature: `X-Trainforge-Signature: t=<unix ts>,v1=<hex HMAC-SHA256 of
"<ts>." + body>` under the team's signing secret (sealed at rest like team
secrets); `X-Trainforge-Delivery` is the delivery id, the same on every try,
for receivers that deduplicate.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as pysecrets
import time
from collections.abc import Callable

from trainforge_services.common.adapters.mongo import (
    ASCENDING,
    DESCENDING,
    Database,
    ReturnDocument,
    mapped_as,
)
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.secrets import SecretBox

HOOKS = "team_webhooks"
OUTBOX = "webhook_outbox"
SIGNATURE_HEADER = "X-Trainforge-Signature"
DELIVERY_HEADER = "X-Trainforge-Delivery"
_SIGNING_NAME = "webhook-signing"  # the name the signing secret is sealed under (bound into its ciphertext)

PENDING, SENDING, DELIVERED, FAILED = "pending", "sending", "delivered", "failed"
mapped = mapped_as("notification store")


def check_url(url: str, field: str = "webhook") -> str:
    """The URL's form; where it may point is services/common/destinations.py's rule."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 2048 or " " in url:
        raise InvalidArgument(f"{field} must be an http:// or https:// URL of at most 2048 characters",
                              details=[{"field": field, "message": "must be an http(s) URL"}])
    return url


def sign(secret: str, body: bytes, ts: int) -> str:
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def verify(secret: str, body: bytes, header: str, *, tolerance: float = 300, now: float | None = None) -> bool:
    """What a receiver does: the signature matches and is recent (for tests and the docs)."""
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        ts = int(parts["t"])
    except (ValueError, KeyError):
        return False
    if abs((now or time.time()) - ts) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, body, ts), header)


def delivery_id(job_id: str, event_seq: int, url: str) -> str:
    return f"{job_id}-{event_seq}-{hashlib.sha256(url.encode()).hexdigest()[:10]}"


class TeamWebhooks:
    """Each team's default webhook URL and its signing secret (sealed)."""

    def __init__(self, db: Database, box: SecretBox | Callable[[], SecretBox], collection: str = HOOKS):
        self._docs = db[collection]
        self._box = box

    def _sealer(self) -> SecretBox:
        return self._box if isinstance(self._box, SecretBox) else self._box()

    @mapped
    def signing_secret(self, team: str) -> str:
        """The team's signing secret, made on first use."""
        doc = self._docs.find_one({"_id": team}) or {}
        if not doc.get("signing_secret"):
            sealed = self._sealer().seal(team, _SIGNING_NAME, "whsec_" + pysecrets.token_urlsafe(32))
            self._docs.update_one({"_id": team}, {"$setOnInsert": {"url": None}}, upsert=True)
            # matches only while no secret is set: of two racing callers, the first one's stays
            self._docs.update_one({"_id": team, "signing_secret": None}, {"$set": {"signing_secret": sealed}})
            doc = self._docs.find_one({"_id": team}) or {}
        return self._sealer().open(team, _SIGNING_NAME, doc["signing_secret"])

    @mapped
    def default_url(self, team: str) -> str | None:
        return (self._docs.find_one({"_id": team}) or {}).get("url")

    @mapped
    def set_default(self, team: str, url: str | None) -> dict:
        if url is not None:
            check_url(url)
        self._docs.update_one({"_id": team}, {"$set": {"url": url, "updated_at": time.time()}}, upsert=True)
        return self.describe(team)

    def describe(self, team: str) -> dict:
        """What a team admin sees: the default URL and the signing secret their receiver verifies with."""
        return {"team": team, "webhook": self.default_url(team), "signing_secret": self.signing_secret(team)}


class Outbox:
    def __init__(self, db: Database, collection: str = OUTBOX):
        self._docs = db[collection]

    @mapped
    def ensure_indexes(self) -> None:
        self._docs.create_index([("status", ASCENDING), ("next_at", ASCENDING)])
        self._docs.create_index([("job_id", ASCENDING), ("created_at", ASCENDING)])

    @mapped
    def enqueue(self, *, job_id: str, team: str, event: dict, url: str, payload: bytes) -> bool:
        """Add one delivery; False when this (job, event, URL) is queued already."""
        now = time.time()
        did = delivery_id(job_id, int(event["seq"]), url)
        result = self._docs.update_one(
            {"_id": did},
            {"$setOnInsert": {"job_id": job_id, "team": team, "event": event, "url": url,
                              "payload": payload.decode(), "status": PENDING, "tries": 0, "next_at": now,
                              "lease_until": 0.0, "attempts": {}, "created_at": now, "delivered_at": None}},
            upsert=True)
        return result.upserted_id is not None

    @mapped
    def claim(self, now: float, lease: float) -> dict | None:
        """One due delivery, leased to the caller for `lease` seconds (a crashed sender's lease runs out)."""
        return self._docs.find_one_and_update(
            {"$or": [{"status": PENDING, "next_at": {"$lte": now}},
                     {"status": SENDING, "lease_until": {"$lte": now}}]},
            {"$set": {"status": SENDING, "lease_until": now + lease}},
            sort=[("next_at", ASCENDING)], return_document=ReturnDocument.AFTER)

    @mapped
    def record(self, did: str, attempt: dict, *, status: str, next_at: float = 0.0, refused: str = "") -> None:
        """One attempt's outcome, and where the delivery stands after it (`refused`: the destination rule that
        failed it, services/common/destinations.py)."""
        doc = self._docs.find_one({"_id": did}, {"tries": 1}) or {}
        tries = int(doc.get("tries", 0)) + 1
        fields = {f"attempts.{tries:04d}": attempt, "tries": tries, "status": status, "next_at": next_at,
                  "lease_until": 0.0}
        if status == DELIVERED:
            fields["delivered_at"] = attempt["at"]
        if refused:
            fields["refused"] = refused
        self._docs.update_one({"_id": did}, {"$set": fields})

    @mapped
    def for_job(self, job_id: str, team: str | None = None) -> list[dict]:
        where: dict = {"job_id": job_id}
        if team is not None:
            where["team"] = team
        return [public(d) for d in self._docs.find(where).sort("created_at", ASCENDING)]

    @mapped
    def recent(self, *, team: str | None = None, status: str | None = None, limit: int = 100) -> list[dict]:
        where: dict = {}
        if team is not None:
            where["team"] = team
        if status is not None:
            where["status"] = status
        return [public(d) for d in self._docs.find(where).sort("created_at", DESCENDING).limit(limit)]


def public(doc: dict) -> dict:
    """A delivery as the API shows it (no payload body, attempts in order)."""
    attempts = doc.get("attempts") or {}
    return {"id": doc["_id"], "job_id": doc["job_id"], "team": doc["team"], "url": doc["url"],
            "event": doc.get("event") or {}, "status": doc["status"], "tries": doc.get("tries", 0),
            "created_at": doc.get("created_at"), "delivered_at": doc.get("delivered_at"),
            "refused": doc.get("refused") or "",
            "attempts": [attempts[k] for k in sorted(attempts)]}

"""The Trainer's webhook deliveries: enqueue on terminal/halted states, POST from a worker thread.

The `Announce` rule (rules.py) calls `enqueue` once the store committed the
transition; `enqueue` writes one outbox document per target (the manifest's
`notify.webhook`, the team's default) and wakes the worker. The worker
claims due deliveries with a lease, POSTs them signed, and records each
attempt: 2xx delivers, anything else is tried again after a capped
exponential backoff (services/common/retry.py's `DELIVERY` policy) until `max_tries`.
Before each POST the destination is checked (services/common/destinations.py):
its name is resolved once, every address checked, and the POST goes to the
checked address with the name in Host and SNI; a destination the rule refuses
fails the delivery at once, the rule recorded as its `refused` reason (what
the job's and the admins' notification listings show), never retried.
`reconcile` (at start) enqueues the events of recently ended jobs again -
idempotent by delivery id - so one whose Trainer died between the commit
and the enqueue is not lost.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import httpx

from trainforge_services.common import states
from trainforge_services.common.destinations import Target, WebhookPolicy
from trainforge_services.common.errors import RefusedReference, TrainforgeError
from trainforge_services.common.loop import Loop
from trainforge_services.common.retry import DELIVERY
from trainforge_services.common.states import JobState
from trainforge_services.common.webhooks import (
    DELIVERED,
    DELIVERY_HEADER,
    FAILED,
    PENDING,
    SIGNATURE_HEADER,
    Outbox,
    TeamWebhooks,
    sign,
)
from trainforge_services.trainer.record import JobRecord

log = logging.getLogger(__name__)

ANNOUNCED = states.TERMINAL | {JobState.HALTED}
# Jobs that ended this long before a Trainer start are not reconciled again.
RECONCILE_WINDOW = 24 * 3600.0


def event_of(job: JobRecord) -> dict:
    name = job.state.name.lower()
    return {"type": f"job.{name}", "state": name, "reason": job.reason, "seq": len(job.history),
            "at": job.history[-1].ts if job.history else job.updated_at}


class Notifier:
    def __init__(self, outbox: Outbox, hooks: TeamWebhooks, *, max_tries: int = 8, initial_backoff: float = 1.0,
                 timeout: float = 10.0, lease: float = 60.0, poll: float = 1.0,
                 transport: httpx.BaseTransport | None = None, clock: Callable[[], float] = time.time,
                 policy: WebhookPolicy | None = None):
        self._outbox, self._hooks = outbox, hooks
        self._policy = policy if policy is not None else WebhookPolicy()
        self._max_tries, self._lease = max_tries, lease
        self._retry = DELIVERY.starting(initial_backoff)
        self._clock = clock
        # no proxy from the environment: the connection goes to the address that was checked, or nowhere
        self._http = httpx.Client(timeout=timeout, follow_redirects=False, transport=transport, trust_env=False)
        # every replica delivers: a due delivery is claimed with a lease, so two never POST the same one
        self._loop = Loop("trainer-webhooks", self._deliver_due, interval=poll)

    # -- enqueueing -----------------------------------------------------------------

    def targets(self, job: JobRecord) -> list[str]:
        urls = []
        notify = (job.manifest or {}).get("notify") or {}
        if notify.get("webhook"):
            urls.append(notify["webhook"])
        default = self._hooks.default_url(job.team)
        if default and default not in urls:
            urls.append(default)
        return urls

    def enqueue(self, job: JobRecord) -> None:
        if job.state not in ANNOUNCED:
            return
        event = event_of(job)
        for url in self.targets(job):
            payload = json.dumps({"event": event["type"], "job": {
                "id": job.id, "team": job.team, "name": job.name, "state": event["state"], "reason": job.reason,
                "attempt": job.attempt}, "at": event["at"]}, sort_keys=True).encode()
            if self._outbox.enqueue(job_id=job.id, team=job.team, event=event, url=url, payload=payload):
                log.info("job %s: %s queued for %s", job.id, event["type"], url)
        self._loop.wake()

    def reconcile(self, jobs: list[JobRecord]) -> None:
        """Enqueue the events of jobs that ended recently (a no-op for those already queued)."""
        cutoff = self._clock() - RECONCILE_WINDOW
        for job in jobs:
            if job.state in ANNOUNCED and job.updated_at >= cutoff:
                try:
                    self.enqueue(job)
                except TrainforgeError as e:
                    log.warning("job %s: could not queue its notification: %s", job.id, e.message)

    # -- delivering -----------------------------------------------------------------

    def start(self) -> None:
        self._outbox.ensure_indexes()
        self._loop.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._loop.stop(timeout)
        self._http.close()

    def _deliver_due(self) -> None:
        """Deliver every due delivery (the loop's step: when woken by `enqueue`, else every `poll` seconds)."""
        while not self._loop.stopping.is_set() and self.deliver_one():
            pass

    def deliver_one(self) -> bool:
        """Send one due delivery, if there is one; whether there was."""
        doc = self._outbox.claim(self._clock(), self._lease)
        if doc is None:
            return False
        body = doc["payload"].encode()
        ts = int(self._clock())
        headers = {"Content-Type": "application/json", DELIVERY_HEADER: doc["_id"],
                   SIGNATURE_HEADER: sign(self._hooks.signing_secret(doc["team"]), body, ts),
                   "User-Agent": "trainforge-webhooks/1"}
        started = time.monotonic()
        attempt: dict = {"at": self._clock(), "status_code": None, "error": ""}
        ok = False
        try:
            target = self._policy.target(doc["url"])
        except RefusedReference as e:
            attempt.update(error=f"refused: {e.message}"[:300], ms=0.0)
            self._outbox.record(doc["_id"], attempt, status=FAILED, refused=e.refusals[0]["rule"])
            log.warning("delivery %s of team %s to %s: refused (%s)", doc["_id"], doc["team"], doc["url"],
                        e.message)
            return True
        except OSError as e:  # the name does not resolve now: tried again like an unreachable receiver
            attempt["error"] = f"cannot resolve the host: {e}"[:300]
        else:
            ok = self._post(target, body, headers, attempt)
        attempt["ms"] = round((time.monotonic() - started) * 1000, 1)
        tries = int(doc.get("tries", 0)) + 1
        if ok:
            self._outbox.record(doc["_id"], attempt, status=DELIVERED)
            log.info("delivery %s to %s: delivered on try %d", doc["_id"], doc["url"], tries)
        elif tries >= self._max_tries:
            self._outbox.record(doc["_id"], attempt, status=FAILED)
            log.warning("delivery %s to %s: gave up after %d tries (%s)", doc["_id"], doc["url"], tries,
                        attempt["error"])
        else:
            backoff = self._retry.backoff()
            delay = [backoff.next() for _ in range(tries)][-1]
            self._outbox.record(doc["_id"], attempt, status=PENDING, next_at=self._clock() + delay)
            log.info("delivery %s to %s: %s; trying again in %gs", doc["_id"], doc["url"], attempt["error"], delay)
        return True

    def _post(self, target: Target, body: bytes, headers: dict, attempt: dict) -> bool:
        """POST to the checked address, the URL's name in Host and TLS SNI (the certificate is checked for it)."""
        try:
            resp = self._http.post(target.connect_url, content=body, headers={**headers, "Host": target.host_header},
                                   extensions={"sni_hostname": target.host})
        except httpx.HTTPError as e:
            attempt["error"] = f"{type(e).__name__}: {e}"[:300]
            return False
        attempt["status_code"] = resp.status_code
        if not resp.is_success:
            attempt["error"] = f"HTTP {resp.status_code}"
        return resp.is_success

"""The job gateway: what a job's controller may do in the object and log stores, and nothing more.

A controller holds no store credential of the platform's. It presents its
job's token and ticket (services/common/jobgateway.py) and gets:

- object listings and look-ups (size, SHA-256) of what the job may read: its
  own `jobs/<id>/` and the prefixes the Trainer admitted for it (`reads`: an
  experiment's code, `data:` sources, each checked against the job's team);
- presigned GET URLs for those objects, presigned PUT URLs only under the
  job's own writable prefixes (`WRITABLE`), deletes only there;
- log lines written to the log store, each one checked to be the job's own.

Every call checks the token, the ticket, and that the Trainer does not call
the job finished (a finished job's token is refused; the answer is cached
for `state_seconds`). Presigned URLs live `expires` seconds. Presigning needs
an S3 store: a `file://` store has no credential to withhold, and its
controllers read the directory themselves (docs/THREAT_MODEL.md).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.common import jobgateway
from trainforge_services.common.adapters.logstore import LogLine, LogStore
from trainforge_services.common.adapters.objectstore import ObjectInfo, ObjectStore
from trainforge_services.common.contracts.storekeys import job_prefix
from trainforge_services.common.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from trainforge_services.common.jobgateway import Ticket
from trainforge_services.common.storeaccess import check_key, covered, under

log = logging.getLogger(__name__)

# below the job's own prefix, what its controllers write: outputs, checkpoints, log and metrics archives
WRITABLE = ("outputs", "checkpoints", "logs", "metrics")
FINISHED = frozenset({"completed", "failed", "cancelled"})
EXPIRES = 300
STATE_SECONDS = 1.0
MAX_STATES = 10_000
_FIELDS = frozenset(("job", "team", "learner", "attempt", "stream", "seq", "ts", "line"))


@dataclass
class _State:
    name: str
    at: float


class JobGateway:
    def __init__(self, key: Callable[[], bytes], trainer: TrainerApi, objects: ObjectStore, logs: LogStore, *,
                 expires: int = EXPIRES, state_seconds: float = STATE_SECONDS):
        """`key` gives the credentials key, asked on the first call (building the API touches no file)."""
        self._load_key, self._trainer, self._objects = key, trainer, objects
        self._key_value: bytes | None = None
        self._logs = logs
        self._metrics: LogStore | None = None  # made on the first metrics batch
        self.expires, self._state_seconds = expires, state_seconds
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()

    def _index(self, stream: str) -> LogStore:
        if stream == "log":
            return self._logs
        with self._lock:
            if self._metrics is None:
                self._metrics = self._logs.metrics_store()
            return self._metrics

    @property
    def _key(self) -> bytes:
        if self._key_value is None:
            self._key_value = self._load_key()
        return self._key_value

    # -- who is asking --------------------------------------------------------------

    def admit(self, job_id: str, authorization: str, ticket: str) -> Ticket:
        """The caller's ticket when it holds the job's token and ticket and the job is not finished."""
        try:
            jobgateway.check_token(self._key, job_id, authorization)
            granted = jobgateway.read_ticket(self._key, job_id, ticket or "")
        except PermissionDenied as e:
            raise Unauthenticated(e.message) from None
        state = self._state(granted.team, job_id)
        if state in FINISHED:
            raise PermissionDenied(f"job {job_id} is {state}: its token is no longer accepted")
        return granted

    def _state(self, team: str, job_id: str) -> str:
        now = time.monotonic()
        with self._lock:
            cached = self._states.get(job_id)
        if cached is not None and now - cached.at < self._state_seconds:
            return cached.name
        try:
            state = str(self._trainer.get_job(team, job_id)["state"])
        except NotFound:
            raise PermissionDenied(f"job {job_id} is not a job of team {team}") from None
        with self._lock:
            if len(self._states) >= MAX_STATES:
                self._states.clear()
            self._states[job_id] = _State(state, now)
        return state

    # -- what it may touch --------------------------------------------------------------

    def _readable(self, ticket: Ticket, key: str) -> str:
        key = check_key(key.strip("/"), "key")
        if under(key, job_prefix(ticket.job_id)) or covered(key, ticket.reads):
            return key
        raise PermissionDenied(f"job {ticket.job_id} may not read store://{key}: it reads its own objects and "
                               "what the Trainer granted it at deploy")

    def _writable(self, ticket: Ticket, key: str) -> str:
        key = check_key(key.strip("/"), "key")
        own = job_prefix(ticket.job_id)
        if any(under(key, own + part) and key != own + part for part in WRITABLE):
            return key
        raise PermissionDenied(f"job {ticket.job_id} may not write store://{key}: it writes only under "
                               + ", ".join(f"store://{own}{part}/" for part in WRITABLE))

    def _presigning(self) -> ObjectStore:
        if not hasattr(self._objects, "presign_put"):
            raise Conflict("the gateway hands out object URLs only for an S3 object store; this "
                                     "platform's controllers use its file:// store directly")
        return self._objects

    # -- the object store ---------------------------------------------------------------

    def list(self, ticket: Ticket, prefix: str) -> list[ObjectInfo]:
        return self._objects.list(self._readable(ticket, prefix))

    def info(self, ticket: Ticket, key: str) -> ObjectInfo:
        return self._objects.info(self._readable(ticket, key))

    def read_url(self, ticket: Ticket, key: str) -> tuple[ObjectInfo, str]:
        """The object's size and SHA-256, and a GET URL for it."""
        store = self._presigning()
        info = store.info(self._readable(ticket, key))
        url = store.presign(info.key, self.expires)
        if url is None:
            raise Conflict("the object store cannot presign a download")
        return info, url

    def write_url(self, ticket: Ticket, key: str, sha256: str) -> tuple[str, dict[str, str]]:
        """A PUT URL for `key` and the headers the PUT must carry (the SHA-256 is signed into it)."""
        key = self._writable(ticket, key)
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise InvalidArgument("sha256 must be 64 lowercase hex digits")
        return self._presigning().presign_put(key, self.expires, sha256)  # type: ignore[attr-defined]

    def delete(self, ticket: Ticket, prefix: str) -> int:
        return self._objects.delete_prefix(self._writable(ticket, prefix))

    # -- the log store ------------------------------------------------------------------

    def write_lines(self, ticket: Ticket, stream: str, body: bytes) -> int:
        """Index the archive lines in `body` (JSON lines) in the job's log or metrics index; each must be the
        job's own, in its team, else PermissionDenied and nothing is written."""
        if stream not in jobgateway.LOG_STREAMS:
            raise InvalidArgument(f"stream must be one of {', '.join(jobgateway.LOG_STREAMS)}, got {stream!r}")
        lines = []
        for n, raw in enumerate(body.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                doc = json.loads(raw)
                if not isinstance(doc, dict) or set(doc) != _FIELDS:
                    raise ValueError(f"fields must be {', '.join(sorted(_FIELDS))}")
                line = LogLine(**doc)
                if not all(type(getattr(line, f)) is int for f in ("learner", "attempt", "seq")):
                    raise ValueError("learner, attempt and seq must be integers")
            except (ValueError, TypeError) as e:
                raise InvalidArgument(f"log line {n} is not an archive line: {e}") from None
            if line.job != ticket.job_id or line.team != ticket.team:
                raise PermissionDenied(f"log line {n} names job {line.job!r} of team {line.team!r}; this token "
                                       f"writes only job {ticket.job_id}'s lines")
            # encoded again from what was read: a line sent with a key twice is indexed as it was checked
            lines.append((line.doc_id, json.dumps(doc, separators=(",", ":")).encode()))
        self._index(stream).write_raw(lines)
        return len(lines)

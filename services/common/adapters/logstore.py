"""Learner log lines in Elasticsearch/OpenSearch, behind a small interface.

The only module that imports the `elasticsearch` client. The embedded
stack's OpenSearch-compatible server (osmem-server) rejects the client's
compatibility mimetypes (`application/vnd.elasticsearch+json;
compatible-with=9`), so requests go through `_PlainJsonNode`, which sends
plain `application/json` / `application/x-ndjson`; a real Elasticsearch
accepts both. A URL may carry credentials (`https://user:password@host:9200`:
basic auth), or be `http+unix://<quoted socket path>` for a store that
listens on a unix socket (the embedded stack's).

A log line document:
    {job, team, learner, attempt, stream, seq, ts, line}
with id "<job>.<learner>.<attempt>.<seq>", so re-shipping a batch after a
timeout overwrites instead of duplicating.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from trainforge_services.common.errors import Unavailable

if TYPE_CHECKING:
    from elasticsearch import Elasticsearch

# a store on a unix socket: "http+unix://" and the socket's path, quoted (the embedded stack's, devstack/storesock.py)
UNIX_SCHEME = "http+unix://"
_COMPAT = re.compile(r"application/vnd\.elasticsearch\+([\w-]+)(;\s*compatible-with=\d+)?")

MAPPINGS = {
    "properties": {
        "job": {"type": "keyword"},
        "team": {"type": "keyword"},
        "learner": {"type": "integer"},
        "attempt": {"type": "integer"},
        "stream": {"type": "keyword"},
        "seq": {"type": "long"},
        "ts": {"type": "date"},
        "line": {"type": "text"},
    }
}



log = logging.getLogger(__name__)


def _unavailable(e: Exception) -> Unavailable:
    """One short sentence for clients; the client library's text (hosts, timeouts) goes to this service's log."""
    log.warning("log store unavailable: %s: %s", type(e).__name__, e)
    return Unavailable("log store unavailable; retry shortly")

def metrics_index(log_index: str) -> str:
    """The index of training-metric records beside a log index (same document shape, stream "metric")."""
    return f"{log_index}-metrics"


# The client library is imported on first use, not with this module: importing it costs about a
# second of CPU (its transport package loads aiohttp, httpx and requests), which a controller would
# otherwise pay before starting its learner; its shipper thread pays it beside the learner instead.
def warm() -> None:
    """Import the client library now (no client is made): the local backend's fork server does, before it forks."""
    import elastic_transport  # noqa: F401
    import elasticsearch  # noqa: F401


def _unix_connection(path: str) -> type:
    """An HTTP connection class whose socket is the unix socket `path` (an `http+unix://` URL)."""
    from urllib3.connection import HTTPConnection

    class _UnixConnection(HTTPConnection):
        def _new_conn(self) -> socket.socket:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if isinstance(self.timeout, int | float):
                s.settimeout(self.timeout)
            try:
                s.connect(path)
            except OSError as e:
                s.close()
                from urllib3.exceptions import NewConnectionError

                raise NewConnectionError(self, f"cannot connect to {path}: {e}") from e
            return s

    return _UnixConnection


def _client(url: str, timeout: float) -> Elasticsearch:
    from elastic_transport import NodeConfig, Urllib3HttpNode
    from elasticsearch import Elasticsearch

    unix = unquote(url[len(UNIX_SCHEME):]) if url.startswith(UNIX_SCHEME) else ""

    class _PlainJsonNode(Urllib3HttpNode):
        def __init__(self, config: NodeConfig):
            super().__init__(config)
            if unix:
                self.pool.ConnectionCls = _unix_connection(unix)

        def perform_request(self, method, target, body=None, headers=None, **kwargs):  # noqa: ANN001
            if headers:
                headers = headers.copy()
                for name in ("accept", "content-type"):
                    if name in headers:
                        headers[name] = _COMPAT.sub(r"application/\1", headers[name])
            return super().perform_request(method, target, body=body, headers=headers, **kwargs)

    hosts = [NodeConfig("http", "localhost", 80)] if unix else url
    return Elasticsearch(hosts, node_class=_PlainJsonNode, request_timeout=timeout, max_retries=1)


def _api_error() -> type[Exception]:
    from elasticsearch import ApiError

    return ApiError


def _errors() -> tuple[type[Exception], ...]:
    """What the client raises when the store is unreachable or refuses (an `except` evaluates it only
    when something was raised, so the library is imported by then)."""
    from elastic_transport import ConnectionError as TransportConnectionError

    return (TransportConnectionError, _api_error())


@dataclass(frozen=True)
class LogLine:
    job: str
    team: str
    learner: int
    attempt: int
    stream: str  # "stdout" | "stderr" | "system"
    seq: int  # per (job, learner, attempt), from 1, without gaps
    ts: str  # ISO-8601 UTC with milliseconds
    line: str

    @property
    def doc_id(self) -> str:
        return f"{self.job}.{self.learner}.{self.attempt}.{self.seq}"

    def to_doc(self) -> dict:
        return {"job": self.job, "team": self.team, "learner": self.learner, "attempt": self.attempt,
                "stream": self.stream, "seq": self.seq, "ts": self.ts, "line": self.line}


@dataclass(frozen=True)
class LogPage:
    lines: list[dict]
    # Per stream "<learner>:<attempt>" -> last seq returned; pass back as `after`.
    cursor: dict[str, int]


class LogStore:
    def __init__(self, url: str, index: str = "tf-logs", timeout: float = 10.0):
        self.url, self.index, self._timeout = url, index, timeout
        self._es_client: Any = None
        self._es_lock = threading.Lock()
        self._index_ready = False

    @property
    def _es(self) -> Elasticsearch:
        if self._es_client is None:
            with self._es_lock:
                if self._es_client is None:
                    self._es_client = _client(self.url, self._timeout)
        return self._es_client

    def close(self) -> None:
        if self._es_client is not None:
            self._es_client.close()

    def metrics_store(self) -> LogStore:
        """The store of training-metric records beside this log index, on the same server."""
        return LogStore(self.url, metrics_index(self.index), self._timeout)

    def healthy(self) -> bool:
        try:
            return bool(self._es.ping())
        except Exception:  # noqa: BLE001
            return False

    def ensure_index(self) -> None:
        if self._index_ready:
            return
        try:
            if not self._es.indices.exists(index=self.index):
                try:
                    self._es.indices.create(index=self.index, mappings=MAPPINGS)
                except _api_error() as e:
                    if "already_exists" not in str(e) and "exists" not in str(e):
                        raise
        except _errors() as e:
            raise _unavailable(e) from None
        self._index_ready = True

    def write(self, lines: list[LogLine], refresh: bool = False) -> None:
        """Index a batch; raises Unavailable when any line was not stored (retry the batch)."""
        if not lines:
            return
        self.ensure_index()
        ops: list[dict] = []
        for ln in lines:
            ops.append({"index": {"_index": self.index, "_id": ln.doc_id}})
            ops.append(ln.to_doc())
        self._bulk(ops, len(lines), refresh)

    def write_raw(self, docs: list[tuple[str, bytes]], refresh: bool = False) -> None:
        """Index documents already encoded as JSON (archive lines), as `write` does; one request body."""
        if not docs:
            return
        self.ensure_index()
        body = bytearray()
        for doc_id, raw in docs:
            body += b'{"index":{"_index":%s,"_id":%s}}\n' % (json.dumps(self.index).encode(), json.dumps(doc_id).encode())
            body += raw if raw.endswith(b"\n") else raw + b"\n"
        self._bulk(bytes(body), len(docs), refresh)

    def _bulk(self, operations: object, count: int, refresh: bool) -> None:
        try:
            resp = self._es.bulk(operations=operations, refresh=refresh)
        except _errors() as e:
            raise _unavailable(e) from None
        if resp.get("errors"):
            failed = [i for i in resp.get("items", []) if next(iter(i.values())).get("error")]
            raise Unavailable(f"log store rejected {len(failed)} of {count} lines: {failed[:1]}")

    def count(self, job: str, *, team: str | None = None, learner: int | None = None) -> int:
        """How many of a job's lines the index holds (0 when the index does not exist)."""
        filters: list[dict] = [{"term": {"job": job}}]
        if team is not None:
            filters.append({"term": {"team": team}})
        if learner is not None:
            filters.append({"term": {"learner": learner}})
        try:
            if not self._es.indices.exists(index=self.index):
                return 0
            return int(self._es.count(index=self.index, query={"bool": {"filter": filters}})["count"])
        except _errors() as e:
            raise _unavailable(e) from None

    def delete_job(self, job: str) -> None:
        """Drop every indexed line of a job (retention, or before a reindex)."""
        try:
            if self._es.indices.exists(index=self.index):
                self._es.delete_by_query(index=self.index, query={"term": {"job": job}}, refresh=True)
        except _errors() as e:
            raise _unavailable(e) from None

    def refresh(self) -> None:
        try:
            self._es.indices.refresh(index=self.index)
        except _errors() as e:
            raise _unavailable(e) from None

    def read(self, job: str, *, team: str | None = None, learner: int | None = None,
             after: dict[str, int] | None = None, limit: int = 1000, query: str | None = None) -> LogPage:
        """Lines of a job in order (time, then learner, then seq), after a cursor.

        The cursor holds the last seq seen per (learner, attempt) stream, so a
        line shipped late by one learner is still returned by the next call.
        """
        after = after or {}
        filters: list[dict] = [{"term": {"job": job}}]
        if team is not None:
            filters.append({"term": {"team": team}})
        if learner is not None:
            filters.append({"term": {"learner": learner}})
        should: list[dict] = []
        for stream, seq in after.items():
            lr, _, at = stream.partition(":")
            should.append({"bool": {"filter": [{"term": {"learner": int(lr)}}, {"term": {"attempt": int(at)}},
                                               {"range": {"seq": {"gt": seq}}}]}})
        if after:
            known = [{"bool": {"filter": [{"term": {"learner": int(s.partition(':')[0])}},
                                          {"term": {"attempt": int(s.partition(':')[2])}}]}} for s in after]
            should.append({"bool": {"must_not": known}})
        q: dict = {"bool": {"filter": filters}}
        if should:
            q["bool"]["should"] = should
            q["bool"]["minimum_should_match"] = 1
        if query:
            q["bool"]["must"] = [{"match": {"line": query}}]
        try:
            if not self._es.indices.exists(index=self.index):
                return LogPage([], dict(after))
            resp = self._es.search(index=self.index, query=q, size=limit,
                                   sort=[{"ts": "asc"}, {"learner": "asc"}, {"attempt": "asc"}, {"seq": "asc"}])
        except _errors() as e:
            raise _unavailable(e) from None
        lines = [h["_source"] for h in resp["hits"]["hits"]]
        if query:
            # Search hits are a selection: no per-stream continuity to keep.
            cursor = dict(after)
            for ln in lines:
                key = f"{ln['learner']}:{ln['attempt']}"
                cursor[key] = max(cursor.get(key, 0), ln["seq"])
            return LogPage(lines, cursor)
        # A page cut at `limit` may end mid-stream; keep per-stream order by
        # returning each stream only up to its first gap.
        cursor = dict(after)
        ordered: list[dict] = []
        for ln in lines:
            key = f"{ln['learner']}:{ln['attempt']}"
            if ln["seq"] != cursor.get(key, 0) + 1:
                continue
            cursor[key] = ln["seq"]
            ordered.append(ln)
        return LogPage(ordered, cursor)

"""The object and log stores as a job's controller reaches them: through the API's job gateway only.

The controller holds its job's token and ticket (services/common/jobgateway.py),
no store credential. `GatewayStore` is an `ObjectStore`: listings, look-ups
and deletes are gateway calls; bytes go straight between the controller and
the store on presigned URLs the gateway hands out for one object at a time
(so the API carries no checkpoint's bytes). Uploads are verified as
`S3Store`'s are: the SHA-256 is signed into the PUT URL as the object's
metadata, and size and SHA-256 are read back before `put_file` returns;
downloads land in a temporary file, moved into place once both match. One
upload is one PUT, so an object is at most 5 GiB on S3.

`GatewayLogSink` is a `LogSink`: a batch of archive lines is one POST, which
the gateway indexes after checking every line is the job's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx

from trainforge_services.common import jobgateway
from trainforge_services.common.adapters.logstore import LogLine, LogStore, metrics_index
from trainforge_services.common.adapters.objectstore import (
    ObjectInfo,
    ObjectStore,
    PutBytesViaFile,
    StoreError,
    sha256_file,
    store_from_settings,
)
from trainforge_services.common.adapters.objectstore.base import TRANSFERRED
from trainforge_services.common.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    TrainforgeError,
    Unauthenticated,
    Unavailable,
)
from trainforge_services.common.settings import ControllerSettings

from .logship import LogSink

_ERRORS: dict[int, type[TrainforgeError]] = {400: InvalidArgument, 401: Unauthenticated, 403: PermissionDenied,
                                             404: NotFound, 409: Conflict, 422: InvalidArgument}
CHUNK = 1 << 20


class GatewayClient:
    """Calls to one job's gateway routes, with its token and ticket."""

    def __init__(self, url: str, job_id: str, token: str, ticket: str, *, timeout: float = 30.0):
        if not (url and token and ticket):
            raise InvalidArgument(f"the job gateway needs {jobgateway.URL_ENV}, {jobgateway.TOKEN_ENV} and "
                                  f"{jobgateway.TICKET_ENV}")
        self.base = f"{url.rstrip('/')}{jobgateway.PREFIX}/{job_id}"
        self._http = httpx.Client(timeout=timeout, headers={
            "Authorization": f"Bearer {token}", jobgateway.TICKET_HEADER: ticket})

    def close(self) -> None:
        self._http.close()

    def call(self, path: str, body: dict | None = None, *, content: bytes | None = None) -> dict:
        try:
            resp = self._http.post(f"{self.base}/{path}", json=body, content=content)
        except httpx.HTTPError as e:
            raise Unavailable(f"cannot reach the job gateway at {self.base}: {e}") from None
        if resp.status_code == 200:
            return resp.json()
        try:
            message = resp.json().get("error", {}).get("message") or resp.text
        except ValueError:
            message = resp.text
        raise _ERRORS.get(resp.status_code, Unavailable)(f"job gateway: {message}")


class GatewayStore(PutBytesViaFile):
    def __init__(self, client: GatewayClient, *, timeout: float = 120.0):
        self._gw = client
        # no token here: presigned URLs carry their own authority, and the store must never see the job's token
        self._http = httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0))

    def close(self) -> None:
        self._http.close()
        self._gw.close()

    def info(self, key: str) -> ObjectInfo:
        doc = self._gw.call("objects/info", {"key": key})
        return ObjectInfo(doc["key"], doc["size"], doc["sha256"])

    def exists(self, key: str) -> bool:
        try:
            self.info(key)
            return True
        except NotFound:
            return False

    def list(self, prefix: str) -> list[ObjectInfo]:
        return [ObjectInfo(d["key"], d["size"], "") for d in self._gw.call("objects/list", {"prefix": prefix})["objects"]]

    def delete_prefix(self, prefix: str) -> int:
        return int(self._gw.call("objects/delete", {"prefix": prefix})["deleted"])

    def presign(self, key: str, expires: int) -> str | None:
        return None  # a job's URLs are its own; nothing it hands on needs one

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        path = Path(path)
        want = ObjectInfo(key.strip("/"), path.stat().st_size, sha256_file(path))
        doc = self._gw.call("objects/write", {"key": key, "sha256": want.sha256})
        try:
            with open(path, "rb") as f:
                resp = self._http.put(doc["url"], content=_chunks(f), headers={
                    **doc["headers"], "Content-Length": str(want.size)})
        except httpx.HTTPError as e:
            raise StoreError(f"upload of {key} to the object store failed: {e}") from None
        if resp.status_code != 200:
            raise StoreError(f"object store refused the upload of {key}: {resp.status_code} {resp.text[:300]}")
        got = self.info(key)
        if got != want:
            raise StoreError(f"upload of {key} did not verify: stored {got}, local {want}")
        TRANSFERRED.add("put", want.size)
        return want

    def _open(self, key: str) -> tuple[ObjectInfo, httpx.Response]:
        doc = self._gw.call("objects/read", {"key": key})
        info = ObjectInfo(doc["key"], doc["size"], doc["sha256"])
        try:
            resp = self._http.send(self._http.build_request("GET", doc["url"]), stream=True)
        except httpx.HTTPError as e:
            raise StoreError(f"download of {key} from the object store failed: {e}") from None
        if resp.status_code != 200:
            resp.close()
            raise StoreError(f"object store refused the download of {key}: {resp.status_code}")
        return info, resp

    def get_file(self, key: str, path: Path) -> ObjectInfo:
        path = Path(path)
        info, resp = self._open(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.download-")
        try:
            with os.fdopen(fd, "wb") as f:
                for block in resp.iter_bytes(CHUNK):
                    f.write(block)
            got = ObjectInfo(info.key, Path(tmp).stat().st_size, sha256_file(Path(tmp)))
            _check(key, got, info)
            os.replace(tmp, path)
        except httpx.HTTPError as e:
            raise StoreError(f"download of {key} from the object store failed: {e}") from None
        finally:
            resp.close()
            if os.path.exists(tmp):
                os.unlink(tmp)
        TRANSFERRED.add("get", got.size)
        return got

    def get_bytes(self, key: str) -> bytes:
        info, resp = self._open(key)
        try:
            data = resp.read()
        finally:
            resp.close()
        _check(key, ObjectInfo(info.key, len(data), hashlib.sha256(data).hexdigest()), info)
        TRANSFERRED.add("get", len(data))
        return data

    def iter_bytes(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        _, resp = self._open(key)

        def chunks() -> Iterator[bytes]:
            try:
                for block in resp.iter_bytes(chunk):
                    TRANSFERRED.add("get", len(block))
                    yield block
            finally:
                resp.close()

        return chunks()


def _chunks(f) -> Iterator[bytes]:  # noqa: ANN001 - an open binary file
    while block := f.read(CHUNK):
        yield block


def _check(key: str, got: ObjectInfo, want: ObjectInfo) -> None:
    if got.size != want.size or (want.sha256 and got.sha256 != want.sha256):
        raise StoreError(f"download of {key} did not verify: got {got.size} bytes sha256 {got.sha256}, "
                         f"object has {want.size} bytes sha256 {want.sha256 or '(not recorded)'}")


class GatewayLogSink:
    """A `LogSink` writing one job's lines through its gateway, to its log or its metrics index."""

    def __init__(self, client: GatewayClient, stream: str):
        if stream not in jobgateway.LOG_STREAMS:
            raise ValueError(f"stream must be one of {jobgateway.LOG_STREAMS}")
        self._gw, self._path = client, f"logs/{stream}"

    def write_raw(self, docs: list[tuple[str, bytes]]) -> None:
        if docs:
            self._gw.call(self._path, content=b"".join(raw if raw.endswith(b"\n") else raw + b"\n"
                                                       for _, raw in docs))

    def write(self, lines: list[LogLine]) -> None:
        self.write_raw([(ln.doc_id, json.dumps(ln.to_doc()).encode()) for ln in lines])

    def close(self) -> None:
        """The client is the controller's; it closes it."""


class JobStores:
    """The object store and log sinks of one controller: through its job's gateway when the LCM granted one
    (`gateway_url`), else the platform's own from its settings. Each is made on first use."""

    def __init__(self, settings: ControllerSettings, job_id: str):
        self._settings, self._job_id = settings, job_id
        self._client: GatewayClient | None = None
        self._store: ObjectStore | None = None
        self._sinks: list = []

    @property
    def via_gateway(self) -> bool:
        return bool(self._settings.gateway_url)

    def _gateway(self) -> GatewayClient:
        if self._client is None:
            s = self._settings
            self._client = GatewayClient(s.gateway_url, self._job_id, s.job_token, s.job_ticket)
        return self._client

    def objects(self) -> ObjectStore:
        if self._store is None:
            self._store = (GatewayStore(self._gateway()) if self.via_gateway and self._settings.objectstore()
                           .startswith("s3://") else store_from_settings(self._settings))
        return self._store

    def log_sink(self, stream: str) -> LogSink:
        """The sink of the job's "log" or "metrics" lines."""
        if self.via_gateway:
            return GatewayLogSink(self._gateway(), stream)
        index = self._settings.logstore_index
        sink = LogStore(self._settings.logstore_url, index if stream == "log" else metrics_index(index))
        self._sinks.append(sink)
        return sink

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()
        if self._store is not None and hasattr(self._store, "close"):
            self._store.close()
        if self._client is not None:
            self._client.close()

"""The test node's HTTP client for the Kubernetes API: JSON in, JSON out, and watches as line streams.

Plain httpx rather than the `kubernetes` package: the node needs a handful of
verbs on raw objects (bindings, status patches, watches that resume from a
resourceVersion) and a fast start, and keeping the objects as dicts means
what it writes is exactly what the apiserver stores.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class ApiError(RuntimeError):
    """A non-2xx answer; `status` is the HTTP code, `reason` the Status reason (NotFound, Conflict, ...)."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class WatchExpired(RuntimeError):
    """The watch's resourceVersion is too old (410 Gone): list again."""


@dataclass(frozen=True)
class Credentials:
    server: str
    token: str
    ca_file: Path

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Credentials:
        """The current context's server, token and CA file (the shape tests/kube.py writes; JSON or YAML)."""
        import yaml

        conf = yaml.safe_load(path.read_text())
        ctx = next(c["context"] for c in conf["contexts"] if c["name"] == conf["current-context"])
        cluster = next(c["cluster"] for c in conf["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in conf["users"] if u["name"] == ctx["user"])
        if "token" not in user or "certificate-authority" not in cluster:
            raise ValueError(f"{path}: the test node needs a token user and a certificate-authority file")
        return cls(cluster["server"], user["token"], Path(cluster["certificate-authority"]))


class Kube:
    def __init__(self, creds: Credentials, timeout: float = 15):
        self.creds = creds
        self._ctx = ssl.create_default_context(cafile=str(creds.ca_file))
        self._http = self._client(timeout)

    def _client(self, timeout: float | None) -> httpx.Client:
        return httpx.Client(base_url=self.creds.server, verify=self._ctx, timeout=timeout,
                            headers={"Authorization": f"Bearer {self.creds.token}", "Accept": "application/json"})

    def close(self) -> None:
        self._http.close()

    def _do(self, method: str, path: str, body=None, content_type: str = "application/json", **params) -> dict:
        content = None if body is None else json.dumps(body)
        resp = self._http.request(method, path, content=content, params=params or None,
                                  headers={"Content-Type": content_type})
        if resp.status_code >= 300:
            raise _error(resp.status_code, resp.content)
        return resp.json() if resp.content else {}

    def get(self, path: str, **params) -> dict:
        return self._do("GET", path, **params)

    def post(self, path: str, body: dict) -> dict:
        return self._do("POST", path, body)

    def patch(self, path: str, body: dict, content_type: str = STRATEGIC) -> dict:
        return self._do("PATCH", path, body, content_type)

    def delete(self, path: str, body: dict | None = None) -> dict:
        return self._do("DELETE", path, body)

    def watch(self, path: str, resource_version: str, timeout_seconds: int = 60) -> Iterator[tuple[str, dict]]:
        """(type, object) events after resource_version, until the server closes the watch."""
        params = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": str(timeout_seconds),
                  "allowWatchBookmarks": "true"}
        with self._client(None) as http, http.stream("GET", path, params=params) as resp:
            if resp.status_code >= 300:
                raise _error(resp.status_code, resp.read())
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    if event["object"].get("code") == 410:
                        raise WatchExpired(event["object"].get("message", "resourceVersion too old"))
                    raise ApiError(event["object"].get("code", 500), event["object"].get("reason", ""),
                                   event["object"].get("message", ""))
                yield event["type"], event["object"]


def _error(status: int, content: bytes) -> ApiError:
    try:
        body = json.loads(content)
        return ApiError(status, body.get("reason", ""), body.get("message", content.decode(errors="replace")))
    except ValueError:
        return ApiError(status, "", content.decode(errors="replace")[:500])

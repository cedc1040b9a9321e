"""Experiments in the SDK: submit a sweep recipe with its code, follow it, halt, resume, cancel.

Reached as `Client.experiments`; requests go through the client it was
made from (key, retries, error mapping). `recipe_kind` tells a job manifest
from an experiment recipe (`kind: experiment`, a top-level `parameters:`,
or Hyper's `experiments:` shape) without the server, so `trainforge submit`
sends each to its route. The code folder is the recipe's `code:` (for
Hyper's shape: the experiment's own `code:`), packed like a job's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trainforge import packing, uploads
from trainforge.sdk_base import ClientError, WaitTimeout

if TYPE_CHECKING:
    from trainforge.sdk import Client

ENDED = ("completed", "failed", "cancelled", "halted")


def recipe_kind(text: str) -> str:
    """"job", "experiment" or "workflow"; a recipe that does not parse is a job (the server reports why)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return "job"
    if not isinstance(data, dict):
        return "job"
    kind = data.get("kind")
    if isinstance(kind, str) and kind.lower() in ("job", "experiment", "workflow"):
        return kind.lower()
    experiments = data.get("experiments")
    if isinstance(experiments, dict):
        return "workflow" if len(experiments) > 1 else "experiment"
    return "experiment" if "parameters" in data else "job"


def _code_dir(text: str, base: Path) -> Path | None:
    data = yaml.safe_load(text)
    experiments = data.get("experiments") if isinstance(data, dict) else None
    if isinstance(experiments, dict) and experiments and not data.get("code"):
        # Hyper's shape: the (first) experiment's own `code:`; a workflow shares one code folder
        body = next(iter(experiments.values()))
        return uploads.code_dir_of(body if isinstance(body, dict) else {}, base)
    return uploads.code_dir_of(text, base)


def _post_recipe(client: Client, route: str, recipe: str | Path, code_dir: str | Path | None,
                 max_upload_bytes: int) -> dict:
    """POST a recipe (a file, or its text with newlines) and its packed code folder to `route`."""
    path = Path(recipe) if not isinstance(recipe, str) or "\n" not in recipe else None
    if path is not None:
        try:
            text = path.read_text()
        except OSError as e:
            raise ClientError(f"cannot read recipe {path}: {e.strerror or e}") from None
        base = path.resolve().parent
    else:
        text, base = str(recipe), Path.cwd()
    folder = Path(code_dir) if code_dir is not None else _code_dir(text, base)
    if folder is None:
        return client._request("POST", route, idempotent=False, data={"recipe": text})
    try:
        code = packing.code_to_send(folder, max_upload_bytes)
    except packing.PackError as e:
        raise ClientError(str(e)) from None
    with packing.temporary_archive(code) as archive:
        return client._request("POST", route, idempotent=False, data={"recipe": text},
                               files={"code": ("code.tar.gz", archive, "application/gzip")},
                               before=lambda: archive.seek(0))


class Experiments:
    """/v1/experiments over a Client."""

    def __init__(self, client: Client):
        self._c = client

    def submit(self, recipe: str | Path, code_dir: str | Path | None = None, *,
               max_upload_bytes: int = packing.DEFAULT_MAX_BYTES) -> dict:
        """Submit an experiment recipe (a file, or its text); its code folder is packed and uploaded once."""
        return _post_recipe(self._c, "/v1/experiments", recipe, code_dir, max_upload_bytes)

    def get(self, experiment_id: str) -> dict:
        """The experiment with its trials, best first, and `best_trial`."""
        return self._c._request("GET", f"/v1/experiments/{experiment_id}")

    def list(self, limit: int = 50) -> list[dict]:
        return self._c._request("GET", "/v1/experiments", params={"limit": limit})["experiments"]

    def halt(self, experiment_id: str) -> dict:
        return self._c._request("POST", f"/v1/experiments/{experiment_id}/halt", idempotent=True)

    def resume(self, experiment_id: str) -> dict:
        return self._c._request("POST", f"/v1/experiments/{experiment_id}/resume", idempotent=True)

    def cancel(self, experiment_id: str) -> dict:
        return self._c._request("POST", f"/v1/experiments/{experiment_id}/cancel", idempotent=True)

    def best(self, experiment_id: str) -> dict | None:
        """The best trial (its index, job id, params and objective), None while no trial reported one."""
        exp = self.get(experiment_id)
        return next((t for t in exp["trials"] if t["best"]), None)

    def wait(self, experiment_id: str, timeout: float | None = None, poll_interval: float = 1.0) -> dict:
        """Poll until the experiment completes, fails, is cancelled or halted; WaitTimeout after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            exp: dict[str, Any] = self._c._request("GET", f"/v1/experiments/{experiment_id}",
                                                   retry_seconds=self._c.reconnect_seconds)
            if exp["state"] in ENDED:
                return exp
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"experiment {experiment_id} is still {exp['state']} after {timeout}s")
            time.sleep(poll_interval)


class Workflows:
    """/v1/workflows over a Client."""

    def __init__(self, client: Client):
        self._c = client

    def submit(self, recipe: str | Path, code_dir: str | Path | None = None, *,
               max_upload_bytes: int = packing.DEFAULT_MAX_BYTES) -> dict:
        """Submit a workflow recipe; its code folder (top-level `code:`, else the first experiment's) is
        uploaded once and shared by every experiment."""
        return _post_recipe(self._c, "/v1/workflows", recipe, code_dir, max_upload_bytes)

    def get(self, workflow_id: str) -> dict:
        return self._c._request("GET", f"/v1/workflows/{workflow_id}")

    def list(self, limit: int = 50) -> list[dict]:
        return self._c._request("GET", "/v1/workflows", params={"limit": limit})["workflows"]

    def cancel(self, workflow_id: str) -> dict:
        return self._c._request("POST", f"/v1/workflows/{workflow_id}/cancel", idempotent=True)

    def wait(self, workflow_id: str, timeout: float | None = None, poll_interval: float = 1.0) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wf: dict[str, Any] = self._c._request("GET", f"/v1/workflows/{workflow_id}",
                                                  retry_seconds=self._c.reconnect_seconds)
            if wf["state"] in ENDED:
                return wf
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"workflow {workflow_id} is still {wf['state']} after {timeout}s")
            time.sleep(poll_interval)

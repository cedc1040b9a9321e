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


class Runs:
    """/v1/<plural> over a Client: what experiments and workflows share (submit, get, list, cancel, wait)."""

    noun = "run"
    plural = "runs"

    def __init__(self, client: Client):
        self._c = client

    def submit(self, recipe: str | Path, code_dir: str | Path | None = None, *,
               max_upload_bytes: int = packing.DEFAULT_MAX_BYTES) -> dict:
        """Submit a recipe (a file, or its text); its code folder is packed and uploaded once for all its jobs."""
        return _post_recipe(self._c, f"/v1/{self.plural}", recipe, code_dir, max_upload_bytes)

    def get(self, run_id: str) -> dict:
        return self._c._request("GET", f"/v1/{self.plural}/{run_id}")

    def list(self, limit: int = 50) -> list[dict]:
        return self._c._request("GET", f"/v1/{self.plural}", params={"limit": limit})[self.plural]

    def _act(self, action: str, run_id: str) -> dict:
        return self._c._request("POST", f"/v1/{self.plural}/{run_id}/{action}", idempotent=True)

    def cancel(self, run_id: str) -> dict:
        return self._act("cancel", run_id)

    def wait(self, run_id: str, timeout: float | None = None, poll_interval: float = 1.0) -> dict:
        """Poll until it completes, fails, is cancelled or halted; WaitTimeout after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run: dict[str, Any] = self._c._request("GET", f"/v1/{self.plural}/{run_id}",
                                                   retry_seconds=self._c.reconnect_seconds)
            if run["state"] in ENDED:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"{self.noun} {run_id} is still {run['state']} after {timeout}s")
            time.sleep(poll_interval)


class Experiments(Runs):
    """/v1/experiments over a Client: a run whose jobs are trials, which also halts, resumes and has a best trial.

    `get` answers the experiment with its trials, best first, and `best_trial`."""

    noun = "experiment"
    plural = "experiments"

    def halt(self, experiment_id: str) -> dict:
        return self._act("halt", experiment_id)

    def resume(self, experiment_id: str) -> dict:
        return self._act("resume", experiment_id)

    def best(self, experiment_id: str) -> dict | None:
        """The best trial (its index, job id, params and objective), None while no trial reported one."""
        exp = self.get(experiment_id)
        return next((t for t in exp["trials"] if t["best"]), None)


class Workflows(Runs):
    """/v1/workflows over a Client: a run of experiments in a DAG. Its code folder (top-level `code:`, else the
    first experiment's) is uploaded once and shared by every experiment; `get` answers it with its nodes."""

    noun = "workflow"
    plural = "workflows"

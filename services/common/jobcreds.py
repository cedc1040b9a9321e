"""Per-job credentials: secrets derived from one platform key, so every holder of the key agrees on them.

A job's credential for a purpose (its etcd user's password, its monitor's
token to the Trainer, ...) is `derive(key, purpose, job_id)`: HMAC-SHA256
of the purpose and the job id under the platform's credentials key. The LCM
derives it when it deploys the job and hands it to that job's own processes
only; a service that checks it (the Trainer for the monitor's token) derives
it again. So nothing is stored per job, a restarted LCM gives a restarted
monitor the same credential, and revoking one is the checker's business (the
etcd user is deleted, the Trainer refuses a job that ended).

The key is the `credentials_key` setting (TF_CREDENTIALS_KEY) of the LCM and
the Trainer, never of the processes that run a job. In dev mode (the embedded
stack) it is generated once into `<state_dir>/credentials.key` (0600).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path

KEY_FILE = "credentials.key"
# the purpose of the job monitor's token to the Trainer's gRPC (common/rpcauth.py)
MONITOR = "monitor"
MIN_KEY_CHARS = 32


def derive(key: bytes, purpose: str, job_id: str) -> str:
    """The job's credential for `purpose`: 43 url-safe characters (256 bits)."""
    if not key:
        raise ValueError("no credentials key")
    mac = hmac.new(key, f"{purpose}\0{job_id}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def matches(key: bytes, purpose: str, job_id: str, presented: str) -> bool:
    """Whether `presented` is the job's credential for `purpose` (a constant-time comparison)."""
    return hmac.compare_digest(derive(key, purpose, job_id).encode(), presented.encode())


def load_key(credentials_key: str, *, dev_mode: bool, state_dir: Path) -> bytes:
    """The credentials key: the setting, or in dev mode `<state_dir>/credentials.key` (made once, 0600).

    ValueError outside dev mode without one, or for one shorter than 32 characters.
    """
    return setting_or_dev(credentials_key, "credentials_key (TF_CREDENTIALS_KEY)",
                          "each job's own credentials are derived from it", dev_mode=dev_mode,
                          path=Path(state_dir) / KEY_FILE)


def setting_or_dev(value: str, setting: str, why: str, *, dev_mode: bool, path: Path) -> bytes:
    """A secret setting's value, or in dev mode the secret made once into `path` (`dev_secret`).

    ValueError naming `setting` outside dev mode without one, or for one shorter than 32 characters.
    """
    if value:
        if len(value) < MIN_KEY_CHARS:
            raise ValueError(f"{setting} must be at least {MIN_KEY_CHARS} characters; "
                             "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
        return value.encode()
    if not dev_mode:
        raise ValueError(f"{setting} is required outside dev mode: {why}")
    return dev_secret(path)


def dev_secret(path: Path, make: Callable[[], str] = lambda: secrets.token_urlsafe(32)) -> bytes:
    """The secret in `path`, made once by `make` (32 random url-safe bytes; mode 0600) when there is none yet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        # written whole, then linked into place: several services may start at once
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(make())
            os.chmod(tmp, 0o600)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    return path.read_bytes().strip()

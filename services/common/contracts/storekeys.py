"""The object-store key layout and the `store://` URIs users see.

Keys, not URIs, are what the object-store adapters take; a URI is
`store://` + key. Every key the platform writes is built by a function
here, so the layout can be read (and changed) in one place:

    jobs/<job>/code.tar.gz                          the code archive the API stored at submit
    jobs/<job>/outputs/<rank>/...                   a learner's outputs, uploaded when it completed
    jobs/<job>/logs/<rank>-<attempt>.jsonl          a learner's complete log archive, per attempt
    jobs/<job>/metrics/<rank>-<attempt>.jsonl       a learner's training metrics (stream "metric"), per attempt
    jobs/<job>/checkpoints/<rank>/<step:012d>/...   a learner's verified checkpoint copies
    experiments/<experiment>/code.tar.gz            an experiment's code archive, shared by its trials
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainforge_services.common.errors import InvalidArgument

SCHEME = "store://"
_STEP_DIR = re.compile(r"^\d{12}$")


def key_from_uri(uri: str) -> str:
    """The key of a `store://` URI; InvalidArgument for another scheme or a key that climbs out."""
    if not uri.startswith(SCHEME):
        raise InvalidArgument(f"{uri!r} is not an object-store URI (store://...)")
    key = uri[len(SCHEME):].strip("/")
    if not key or ".." in key.split("/"):
        raise InvalidArgument(f"{uri!r} has an invalid key")
    return key


def uri_for(key: str) -> str:
    return SCHEME + key.strip("/")


def uri_for_prefix(prefix: str) -> str:
    """The URI of a key prefix (a "folder"), with its trailing slash."""
    return SCHEME + prefix.strip("/") + "/"


def job_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/"


def code_key(job_id: str) -> str:
    return f"jobs/{job_id}/code.tar.gz"


def experiment_code_key(experiment_id: str) -> str:
    """Every trial of the experiment runs this code (its jobs' `code_uri`)."""
    return f"experiments/{experiment_id}/code.tar.gz"


def outputs_root(job_id: str) -> str:
    return f"jobs/{job_id}/outputs/"


def outputs_prefix(job_id: str, rank: int) -> str:
    return f"jobs/{job_id}/outputs/{rank}/"


def log_key(job_id: str, rank: int, attempt: int) -> str:
    return f"jobs/{job_id}/logs/{rank}-{attempt}.jsonl"


def logs_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/logs/"


def metrics_key(job_id: str, rank: int, attempt: int) -> str:
    return f"jobs/{job_id}/metrics/{rank}-{attempt}.jsonl"


def metrics_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/metrics/"


@dataclass(frozen=True)
class ArchiveKey:
    """A learner attempt's log or metrics archive, parsed from its key."""

    job_id: str
    kind: str  # "logs" or "metrics"
    rank: int
    attempt: int


_ARCHIVE_KEY = re.compile(r"^jobs/([^/]+)/(logs|metrics)/(\d+)-(\d+)\.jsonl$")


def parse_archive_key(key: str) -> ArchiveKey | None:
    """The archive a key names (the inverse of log_key and metrics_key); None for any other key."""
    m = _ARCHIVE_KEY.match(key)
    return ArchiveKey(m.group(1), m.group(2), int(m.group(3)), int(m.group(4))) if m else None


def checkpoint_root(job_id: str) -> str:
    """The key prefix of a job's checkpoints: `<root><rank>/<step:012d>/...` lie under it."""
    return f"jobs/{job_id}/checkpoints/"


def checkpoint_rank_prefix(root: str, rank: int) -> str:
    return f"{root.rstrip('/')}/{rank}/"


def checkpoint_step_prefix(root: str, rank: int, step: int) -> str:
    return f"{root.rstrip('/')}/{rank}/{step:012d}/"


def is_step_dir(name: str) -> bool:
    return bool(_STEP_DIR.match(name))


def split_checkpoint_uri(uri: str) -> tuple[str, int | None]:
    """(checkpoint root key, step) of a checkpoint URI: a job's root, or one step's copy `<root>/<rank>/<step>/`."""
    key = key_from_uri(uri).rstrip("/")
    tail = key.rsplit("/", 2)
    if len(tail) == 3 and is_step_dir(tail[2]) and tail[1].isdigit():
        return tail[0], int(tail[2])
    return key, None

"""Accepting a job: validate the manifest, store the code, hand the job to the Trainer.

The API chooses the job id so the code archive can be stored under it
before the Trainer hears of the job; the Trainer never sees a job whose code
is missing. With an Idempotency-Key the id is derived from (team, key), so a
retried submit finds the job the first attempt created instead of creating a
second one.
"""

from __future__ import annotations

import logging
import posixpath
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from trainforge_services.api.identity import Tenant
from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.common import reqlines
from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.contracts.ids import new_job_id
from trainforge_services.common.contracts.storekeys import code_key, uri_for
from trainforge_services.common.destinations import WebhookPolicy
from trainforge_services.common.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    RefusedReference,
    TrainforgeError,
)
from trainforge_services.common.manifest import Manifest, parse_manifest

log = logging.getLogger(__name__)

_MAX_IDEMPOTENCY_KEY = 255
# A requirements file larger than this is not read at submit (the controller refuses it: the same bound).
MAX_REQUIREMENTS_BYTES = 1 << 20


class PayloadTooLarge(TrainforgeError):
    code = "payload_too_large"
    http_status = 413


@dataclass(frozen=True)
class Submitted:
    job: dict
    created: bool  # False: an earlier request with the same Idempotency-Key created it


def check_archive(path: Path) -> None:
    """Raise InvalidArgument unless path is a complete gzip tar whose members stay inside their folder."""
    bad = InvalidArgument("code: not a tar.gz archive",
                          details=[{"field": "code", "message": "not a tar.gz archive"}])
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            members = tar.getmembers()
    except (tarfile.TarError, OSError, EOFError):
        raise bad from None
    for m in members:
        parts = Path(m.name).parts
        if m.name.startswith("/") or ".." in parts:
            raise InvalidArgument(f"code: archive member {m.name!r} points outside the code folder",
                                  details=[{"field": "code", "message": f"unsafe member {m.name!r}"}])


def check_requirements_file(archive: Path, spec: str) -> None:
    """RefusedReference when the archive's requirements file `spec` has a line reqlines refuses. A file that is
    not a plain member of at most MAX_REQUIREMENTS_BYTES is left to the controller, which reads the extracted
    folder (a link, say) and refuses the same lines before it builds anything."""
    wanted = posixpath.normpath(spec)
    with tarfile.open(archive, mode="r:gz") as tar:
        member = next((m for m in tar if posixpath.normpath(m.name) == wanted), None)
        if member is None or not member.isfile() or member.size > MAX_REQUIREMENTS_BYTES:
            return
        stream = tar.extractfile(member)
        data = stream.read(MAX_REQUIREMENTS_BYTES + 1) if stream is not None else b""
    try:
        reqlines.file_lines(data.decode("utf-8"), spec)
    except UnicodeDecodeError:
        return  # the controller names it
    except reqlines.RefusedLine as e:
        raise RefusedReference(str(e.refusal), refusals=[e.refusal.audit()],
                               details=[{"field": "requirements", "message": str(e.refusal)}]) from None


def check_references(manifest: Manifest, webhooks: WebhookPolicy | None) -> None:
    """What the manifest names that the platform would reach for the tenant, besides its requirement lines
    (the manifest's own validator): the webhook's destination."""
    if webhooks is not None and manifest.notify is not None:
        webhooks.check_url(manifest.notify.webhook, "notify.webhook")


def submit_job(trainer: TrainerApi, objects: ObjectStore, tenant: Tenant, *, manifest_text: str,
               code: BinaryIO | None, code_size: int | None, max_upload_bytes: int,
               idempotency_key: str | None = None, webhooks: WebhookPolicy | None = None) -> Submitted:
    manifest = parse_manifest(manifest_text)
    check_references(manifest, webhooks)
    manifest_json = manifest.model_dump_json()
    if idempotency_key is not None and not 0 < len(idempotency_key) <= _MAX_IDEMPOTENCY_KEY:
        raise InvalidArgument("Idempotency-Key must be 1-255 characters",
                              details=[{"field": "Idempotency-Key", "message": "1-255 characters"}])
    job_id = new_job_id(tenant.team, idempotency_key)
    if idempotency_key and code is not None:
        # a retry must not store its archive over the first job's code: look for that job first. Without an
        # archive nothing is stored before the Trainer's insert, which refuses a second job with this id
        # (Conflict, answered below), so the first try of a burst costs no extra read.
        earlier = _earlier(trainer, tenant.team, job_id, manifest_json)
        if earlier is not None:
            return Submitted(earlier, created=False)

    code_uri = ""
    if code is not None:
        requirements = manifest.requirements if isinstance(manifest.requirements, str) else None
        code_uri = store_code(objects, code_key(job_id), code, code_size, max_upload_bytes, requirements)
    try:
        job = trainer.submit_job(team=tenant.team, manifest_json=manifest_json, code_uri=code_uri,
                                 submitted_by=tenant.key_id, job_id=job_id)
    except (Conflict, InvalidArgument) as e:
        if idempotency_key:
            # a concurrent retry with the same key won the race, or (not looked for above) this is a retry:
            # it returns the first job even where that job would not be accepted now (a quota lowered since)
            earlier = _earlier(trainer, tenant.team, job_id, manifest_json)
            if earlier is not None:
                return Submitted(earlier, created=False)
        if code_uri and isinstance(e, InvalidArgument):  # after a Conflict the archive is the other job's
            _forget_code(objects, job_id)
        raise
    except TrainforgeError:
        if code_uri:
            _forget_code(objects, job_id)
        raise
    return Submitted(job, created=True)


def _earlier(trainer: TrainerApi, team: str, job_id: str, manifest_json: str) -> dict | None:
    try:
        job = trainer.get_job(team, job_id)
    except NotFound:
        return None
    # compared as models (as the Trainer does), so a job stored before a manifest field was added still matches
    if parse_manifest(job["manifest"]) != parse_manifest(manifest_json):
        raise Conflict("Idempotency-Key was already used with a different manifest",
                       details=[{"field": "Idempotency-Key", "message": f"already used for job {job_id}"}])
    return job


def store_code(objects: ObjectStore, key: str, code: BinaryIO, size: int | None, limit: int,
               requirements: str | None = None) -> str:
    """Check an uploaded code archive (size, its members, the lines of its `requirements` file) and store it at
    `key`; its store:// URI."""
    if size is not None and size > limit:
        raise PayloadTooLarge(f"code: archive is {size} bytes; the limit is {limit}",
                              details=[{"field": "code", "message": f"larger than {limit} bytes"}])
    with tempfile.TemporaryDirectory(prefix="tf-upload-") as tmp:
        path = Path(tmp) / "code.tar.gz"
        with open(path, "wb") as f:
            shutil.copyfileobj(code, f)
        if path.stat().st_size > limit:
            raise PayloadTooLarge(f"code: archive is larger than the limit of {limit} bytes",
                                  details=[{"field": "code", "message": f"larger than {limit} bytes"}])
        check_archive(path)
        if requirements is not None:
            check_requirements_file(path, requirements)
        objects.put_file(key, path)
    return uri_for(key)


def _forget_code(objects: ObjectStore, job_id: str) -> None:
    try:
        objects.delete_prefix(code_key(job_id))
    except Exception:  # noqa: BLE001 - the submit error matters more than a leftover archive
        log.warning("could not remove the code archive of rejected job %s", job_id, exc_info=True)

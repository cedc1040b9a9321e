"""/v1/jobs/{id}/outputs and /checkpoints: a job's results back to the caller.

Tenant-scoped like every job route: the Trainer is asked for the job in the
caller's team first, so another team's job is answered 404 exactly like a
missing one before the store is touched. Files are streamed by the API, or
answered with a 307 redirect to a presigned URL when the object store can
make one (S3); `?redirect=false` always streams. Trees go out as tar streams.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import RedirectResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from trainforge_services.api import outputs
from trainforge_services.api.deps import ObjectsDep, TenantDep, TrainerDep
from trainforge_services.api.schemas import error_responses
from trainforge_services.common.adapters.objectstore import ObjectStore
from trainforge_services.common.contracts.ids import check_job_id

router = APIRouter(prefix="/v1/jobs", tags=["results"], responses=error_responses(400, 401, 404, 422, 429))

# How long a presigned download URL stays valid: enough to start a large download, short enough to leak little.
PRESIGN_SECONDS = 600

JobId = Annotated[str, Path(description="the job id, e.g. j-1a2b3c4d5e6f", max_length=128)]
Rank = Annotated[int, Path(ge=0, le=100_000, description="the learner's rank")]
Step = Annotated[int, Path(ge=0, description="the checkpoint's training step")]
FilePath = Annotated[str, Path(description="the file's path inside the tree, e.g. model/weights.pt", max_length=1024)]
Redirect = Annotated[bool, Query(description="answer 307 to a presigned URL when the object store offers one")]
_FILE = {200: {"content": {"application/octet-stream": {}}, "description": "the file's bytes"},
         307: {"description": "the file is at the presigned URL in `Location`"}}
_TAR = {200: {"content": {"application/x-tar": {}}, "description": "a tar stream of the tree"}}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class StoredFile(_Frozen):
    path: str = Field(description="path inside the learner's tree")
    size: int = Field(description="bytes")
    sha256: str = Field(description="SHA-256 recorded when the file was uploaded (hex)")


class LearnerOutputs(_Frozen):
    rank: int
    files: list[StoredFile]


class OutputList(_Frozen):
    job_id: str
    learners: list[LearnerOutputs]


class LearnerCheckpoints(_Frozen):
    rank: int
    steps: list[int] = Field(description="steps with a complete stored copy, oldest first")


class CheckpointList(_Frozen):
    job_id: str
    learners: list[LearnerCheckpoints]


class CheckpointFiles(_Frozen):
    job_id: str
    rank: int
    step: int
    files: list[StoredFile]


def _job(tenant, trainer, job_id: str) -> str:  # noqa: ANN001 - the route's dependencies
    check_job_id(job_id, "job_id")
    trainer.get_job(tenant.team, job_id)  # NotFound for a missing job or another team's
    return job_id


def _send(store: ObjectStore, f: outputs.TreeFile, redirect: bool):  # noqa: ANN202 - one of two responses
    if redirect and (url := store.presign(f.key, PRESIGN_SECONDS)):
        return RedirectResponse(url, status_code=307)
    name = f.path.rsplit("/", 1)[-1]
    return StreamingResponse(store.iter_bytes(f.key), media_type="application/octet-stream",
                             headers={"Content-Length": str(f.size), "X-Checksum-Sha256": f.sha256,
                                      "Content-Disposition": f'attachment; filename="{name}"'})


def _tar(store: ObjectStore, files: list[tuple[str, outputs.TreeFile]], name: str) -> StreamingResponse:
    return StreamingResponse(outputs.tar_stream(store, files), media_type="application/x-tar",
                             headers={"Content-Disposition": f'attachment; filename="{name}.tar"'})


@router.get("/{job_id}/outputs", response_model=OutputList, summary="A job's outputs per learner, with checksums")
def list_outputs(tenant: TenantDep, trainer: TrainerDep, objects: ObjectsDep, job_id: JobId,
                 learner: Annotated[int | None, Query(ge=0, description="only this learner's outputs")] = None) -> dict:
    """What each learner left in its outputs folder, uploaded when it completed."""
    _job(tenant, trainer, job_id)
    return {"job_id": job_id, "learners": outputs.outputs(objects, job_id, learner)}


@router.get("/{job_id}/outputs/archive", response_class=StreamingResponse, responses=_TAR,
            summary="A job's outputs as one tar stream (`<rank>/<path>`)")
def outputs_archive(tenant: TenantDep, trainer: TrainerDep, objects: ObjectsDep, job_id: JobId,
                    learner: Annotated[int | None, Query(ge=0, description="only this learner's outputs")] = None):
    _job(tenant, trainer, job_id)
    return _tar(objects, outputs.output_files(objects, job_id, learner), f"{job_id}-outputs")


@router.get("/{job_id}/outputs/{rank}/{path:path}", response_class=StreamingResponse, responses=_FILE,
            summary="One output file")
def output_file(tenant: TenantDep, trainer: TrainerDep, objects: ObjectsDep, job_id: JobId, rank: Rank,
                path: FilePath, redirect: Redirect = True):
    """The header `X-Checksum-Sha256` carries the file's recorded SHA-256 when it is streamed."""
    _job(tenant, trainer, job_id)
    return _send(objects, outputs.output_file(objects, job_id, rank, path), redirect)


@router.get("/{job_id}/checkpoints", response_model=CheckpointList, summary="A job's stored checkpoint steps per rank")
def list_checkpoints(tenant: TenantDep, trainer: TrainerDep, objects: ObjectsDep, job_id: JobId) -> dict:
    _job(tenant, trainer, job_id)
    return {"job_id": job_id, "learners": outputs.checkpoint_steps(objects, job_id)}


@router.get("/{job_id}/checkpoints/{rank}/{step}", response_model=CheckpointFiles,
            summary="The files of one checkpoint step, with checksums")
def checkpoint_files(tenant: TenantDep, trainer: TrainerDep, objects: ObjectsDep, job_id: JobId, rank: Rank,
                     step: Step) -> dict:
    _job(tenant, trainer, job_id)
    prefix = outputs.checkpoint_prefix(objects, job_id, rank, step)
    return {"job_id": job_id, "rank": rank, "step": step,
            "files": [f.json() for f in outputs.tree(objects, prefix)]}


@router.get("/{job_id}/checkpoints/{rank}/{step}/archive", response_class=StreamingResponse, responses=_TAR,
            summary="One checkpoint step as a tar stream")
def checkpoint_archive(tenant: TenantDep, trainer: TrainerDep, objects: ObjectsDep, job_id: JobId, rank: Rank,
                       step: Step):
    _job(tenant, trainer, job_id)
    prefix = outputs.checkpoint_prefix(objects, job_id, rank, step)
    files = [(f.path, f) for f in outputs.tree(objects, prefix, checksums=False)]
    return _tar(objects, files, f"{job_id}-{rank}-{step}")


@router.get("/{job_id}/checkpoints/{rank}/{step}/files/{path:path}", response_class=StreamingResponse,
            responses=_FILE, summary="One file of a checkpoint step")
def checkpoint_file(tenant: TenantDep, trainer: TrainerDep, objects: ObjectsDep, job_id: JobId, rank: Rank,
                    step: Step, path: FilePath, redirect: Redirect = True):
    _job(tenant, trainer, job_id)
    return _send(objects, outputs.checkpoint_file(objects, job_id, rank, step, path), redirect)

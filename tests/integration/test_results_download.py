"""A job's results back: outputs and checkpoints listed with checksums, downloaded bit for bit.

The API runs for real (uvicorn on loopback) against the in-memory Trainer,
the real MongoDB-wire identity store and a real object store: a local
directory, or SeaweedFS's S3 gateway, where files are answered with a
redirect to a presigned URL. Files are put where learners upload them
(storekeys), then fetched through `trainforge download` as a user runs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from click.testing import CliRunner

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.integration.test_api_admin import bearer
from tests.integration.test_objectstore_s3 import s3_store
from tests.servers import serve_app
from trainforge import cli
from trainforge.sdk import Client, ClientError
from trainforge_services.api.app import create_app
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.common.adapters.objectstore import LocalStore, put_dir
from trainforge_services.common.contracts.storekeys import (
    checkpoint_root,
    checkpoint_step_prefix,
    outputs_prefix,
)
from trainforge_services.common.settings import ApiSettings

JOB = json.dumps({"name": "two", "framework": "custom", "command": "true", "learners": 2})


@contextlib.contextmanager
def platform(mongo_db, logstore, objects):
    identity = IdentityStore(mongo_db, touch_interval=0)
    keys = {}
    for team in ("alpha", "beta"):
        identity.create_team(team)
        keys[team] = identity.issue_key(team, f"{team}-member", Role.MEMBER)
    app = create_app(ApiSettings(dev_mode=True), trainer=InMemoryTrainer(), identity=identity, logs=logstore,
                     objects=objects)
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield SimpleNamespace(url=url, client=client, objects=objects, keys=keys,
                              h={t: bearer(k) for t, k in keys.items()})


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def two_learner_job(p, tmp_path) -> tuple[str, dict[int, dict[str, bytes]]]:
    """A job of alpha whose two learners uploaded outputs (binary, nested, one over a MiB)."""
    resp = p.client.post("/v1/jobs", data={"manifest": JOB}, headers=p.h["alpha"])
    assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    trees = {rank: {"model.pt": os.urandom(1_500_000 + rank), "metrics/final.json": b'{"acc": 0.9%d}' % rank,
                    "empty.txt": b"", "deep/er/x.bin": bytes(range(256)) * 3}
             for rank in (0, 1)}
    for rank, files in trees.items():
        put_dir(p.objects, outputs_prefix(job_id, rank), write_tree(tmp_path / f"up{rank}", files))
    return job_id, trees


def run_cli(p, *args, team="alpha", tmp_path):
    env = {"TF_STATE_DIR": str(tmp_path / "cli-state"), "TRAINFORGE_API_URL": p.url,
           "TRAINFORGE_API_KEY": p.keys[team]}
    return CliRunner().invoke(cli.main, list(args), env=env, catch_exceptions=False)


def assert_same_tree(dest: Path, trees: dict[int, dict[str, bytes]]) -> None:
    got = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    want = {f"{rank}/{rel}": data for rank, files in trees.items() for rel, data in files.items()}
    assert got.keys() == want.keys()
    for rel, data in want.items():
        assert hashlib.sha256(got[rel]).digest() == hashlib.sha256(data).digest(), rel


@pytest.fixture
def local(mongo_db, logstore, tmp_path):
    with platform(mongo_db, logstore, LocalStore(tmp_path / "objects")) as p:
        yield p


def test_listing_has_sizes_and_checksums_per_learner(local, tmp_path):
    job_id, trees = two_learner_job(local, tmp_path)
    body = local.client.get(f"/v1/jobs/{job_id}/outputs", headers=local.h["alpha"]).json()
    assert [ln["rank"] for ln in body["learners"]] == [0, 1]
    for ln in body["learners"]:
        files = trees[ln["rank"]]
        assert {f["path"]: (f["size"], f["sha256"]) for f in ln["files"]} == {
            rel: (len(data), hashlib.sha256(data).hexdigest()) for rel, data in files.items()}
    only1 = local.client.get(f"/v1/jobs/{job_id}/outputs", params={"learner": 1}, headers=local.h["alpha"]).json()
    assert [ln["rank"] for ln in only1["learners"]] == [1]


def test_cli_download_reproduces_a_two_learner_jobs_outputs_bit_for_bit(local, tmp_path):
    job_id, trees = two_learner_job(local, tmp_path)
    dest = tmp_path / "got"
    result = run_cli(local, "download", job_id, "-o", str(dest), "--json", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["files"]) == 8
    assert_same_tree(dest, trees)
    # one learner only
    result = run_cli(local, "download", job_id, "-o", str(tmp_path / "one"), "--learner", "1", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert_same_tree(tmp_path / "one", {1: trees[1]})


def test_a_file_changed_in_the_store_fails_the_checksum_and_leaves_no_file(local, tmp_path):
    job_id, _ = two_learner_job(local, tmp_path)
    listing = local.client.get(f"/v1/jobs/{job_id}/outputs", headers=local.h["alpha"]).json()
    # the stored bytes change after the listing (same size), so the download must not verify
    stored = tmp_path / "objects" / outputs_prefix(job_id, 0) / "deep/er/x.bin"
    stored.write_bytes(bytes(reversed(stored.read_bytes())))
    client = Client(local.url, local.keys["alpha"])
    with pytest.raises(ClientError, match="did not verify"):
        client.results.download_outputs(job_id, tmp_path / "bad", listing=listing["learners"])
    assert not (tmp_path / "bad" / "0" / "deep" / "er" / "x.bin").exists()
    client.close()


def test_whole_tree_as_a_tar_stream_and_single_files(local, tmp_path):
    job_id, trees = two_learner_job(local, tmp_path)
    resp = local.client.get(f"/v1/jobs/{job_id}/outputs/archive", headers=local.h["alpha"])
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(resp.content)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert got == {f"{r}/{rel}": data for r, files in trees.items() for rel, data in files.items()}
    one = local.client.get(f"/v1/jobs/{job_id}/outputs/1/metrics/final.json", headers=local.h["alpha"])
    assert one.content == trees[1]["metrics/final.json"]
    assert one.headers["x-checksum-sha256"] == hashlib.sha256(trees[1]["metrics/final.json"]).hexdigest()
    assert local.client.get(f"/v1/jobs/{job_id}/outputs/1/nope", headers=local.h["alpha"]).status_code == 404
    assert local.client.get(f"/v1/jobs/{job_id}/outputs/1/..%2F0%2Fmodel.pt",
                            headers=local.h["alpha"]).status_code == 404


def test_another_teams_job_is_404_on_every_results_route(local, tmp_path):
    job_id, _ = two_learner_job(local, tmp_path)
    for path in ("outputs", "outputs/archive", "outputs/0/model.pt", "checkpoints", "checkpoints/0/1",
                 "checkpoints/0/1/archive", "checkpoints/0/1/files/a"):
        resp = local.client.get(f"/v1/jobs/{job_id}/{path}", headers=local.h["beta"])
        assert resp.status_code == 404, (path, resp.text)
        assert resp.json()["error"]["code"] == "not_found"
    result = run_cli(local, "download", job_id, "-o", str(tmp_path / "x"), team="beta", tmp_path=tmp_path)
    assert result.exit_code == 1 and not (tmp_path / "x").exists()


def test_checkpoints_list_only_complete_steps_and_download_one(local, tmp_path):
    job_id, _ = two_learner_job(local, tmp_path)
    root = checkpoint_root(job_id)
    steps = {}
    for rank, step in ((0, 10), (0, 20), (1, 10), (1, 20)):
        steps[rank, step] = {"checkpoint.json": b'{"step": %d}' % step, "state/model.pt": os.urandom(4096)}
        put_dir(local.objects, checkpoint_step_prefix(root, rank, step),
                write_tree(tmp_path / f"ck{rank}-{step}", steps[rank, step]))
    # an incomplete copy (no checkpoint.json yet) is not a step
    local.objects.put_bytes(checkpoint_step_prefix(root, 1, 30) + "state/model.pt", b"partial")
    body = local.client.get(f"/v1/jobs/{job_id}/checkpoints", headers=local.h["alpha"]).json()
    assert body["learners"] == [{"rank": 0, "steps": [10, 20]}, {"rank": 1, "steps": [10, 20]}]
    assert local.client.get(f"/v1/jobs/{job_id}/checkpoints/1/30", headers=local.h["alpha"]).status_code == 404
    result = run_cli(local, "checkpoints", "download", job_id, "--learner", "1", "-o", str(tmp_path / "ck"),
                     tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    got = {p.relative_to(tmp_path / "ck").as_posix(): p.read_bytes()
           for p in (tmp_path / "ck").rglob("*") if p.is_file()}
    assert got == steps[1, 20]
    resp = local.client.get(f"/v1/jobs/{job_id}/checkpoints/0/10/archive", headers=local.h["alpha"])
    with tarfile.open(fileobj=io.BytesIO(resp.content)) as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar.getmembers()} == steps[0, 10]


def test_on_s3_files_are_presigned_redirects_and_download_bit_for_bit(s3_server, mongo_db, logstore, tmp_path, unique):
    s3_store(s3_server, "", create_bucket=True).close()
    store = s3_store(s3_server, f"r-{unique}")
    with platform(mongo_db, logstore, store) as p:
        job_id, trees = two_learner_job(p, tmp_path)
        resp = p.client.get(f"/v1/jobs/{job_id}/outputs/0/model.pt", headers=p.h["alpha"])
        assert resp.status_code == 307 and "Signature=" in resp.headers["location"]
        streamed = p.client.get(f"/v1/jobs/{job_id}/outputs/0/model.pt", params={"redirect": "false"},
                                headers=p.h["alpha"])
        assert streamed.content == trees[0]["model.pt"]
        result = run_cli(p, "download", job_id, "-o", str(tmp_path / "got"), tmp_path=tmp_path)
        assert result.exit_code == 0, result.output
        assert_same_tree(tmp_path / "got", trees)
    store.close()

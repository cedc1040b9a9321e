"""The object store against a real S3 server (SeaweedFS) and, where the behaviour is shared, LocalStore.

Every store-level test runs twice: on a LocalStore in a temporary directory
and on an S3Store over the session's SeaweedFS S3 gateway (one bucket, a
fresh key prefix per test). The S3-only tests cover what a directory cannot
show: multipart uploads, the server-side SHA-256 checksums, verification
failures and refused credentials.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from tests.servers import free_port
from trainforge_services.common.adapters.objectstore import (
    LocalStore,
    S3Store,
    StoreError,
    get_dir,
    open_store,
    put_dir,
    sha256_file,
)
from trainforge_services.common.adapters.objectstore import s3 as objectstore_s3
from trainforge_services.common.adapters.objectstore.base import TRANSFERRED
from trainforge_services.common.errors import InvalidArgument, NotFound

BUCKET = "tf-tests"


def s3_store(server, prefix: str, **kw) -> S3Store:
    opts = {"endpoint": server.extra["endpoint"], "access_key": server.extra["access_key"],
            "secret_key": server.extra["secret_key"], "region": server.extra["region"]} | kw
    return S3Store(BUCKET, prefix, **opts)


@pytest.fixture(scope="session")
def s3_bucket(s3_server) -> str:
    s3_store(s3_server, "", create_bucket=True).close()
    return BUCKET


@pytest.fixture
def raw_s3(s3_server):
    """A plain boto3 client on the same server, to look behind the store's back."""
    client = boto3.client("s3", endpoint_url=s3_server.extra["endpoint"],
                          aws_access_key_id=s3_server.extra["access_key"],
                          aws_secret_access_key=s3_server.extra["secret_key"], region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
    yield client
    client.close()


@pytest.fixture
def s3(request, unique):
    """An S3Store under a fresh prefix (the SeaweedFS server starts on first use)."""
    request.getfixturevalue("s3_bucket")
    store = s3_store(request.getfixturevalue("s3_server"), f"t-{unique}")
    yield store
    store.close()


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        yield LocalStore(tmp_path / "objects")
    else:
        yield request.getfixturevalue("s3")


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# --- behaviour shared by LocalStore and S3Store -------------------------------------------------

def test_put_get_file_round_trip_is_verified(store, tmp_path):
    data = os.urandom(300_000)
    src = write(tmp_path / "src.bin", data)
    info = store.put_file("jobs/j1/code.tar.gz", src)
    assert (info.key, info.size, info.sha256) == ("jobs/j1/code.tar.gz", len(data), hashlib.sha256(data).hexdigest())
    got = store.get_file("/jobs/j1/code.tar.gz", tmp_path / "out" / "deep" / "dst.bin")
    assert got == info
    assert (tmp_path / "out" / "deep" / "dst.bin").read_bytes() == data
    assert not [p for p in (tmp_path / "out" / "deep").iterdir() if p.name != "dst.bin"], "no temp files left"


def test_put_get_bytes_and_overwrite(store):
    before = TRANSFERRED.snapshot()
    first = store.put_bytes("a/b.txt", b"one")
    assert store.get_bytes("a/b.txt") == b"one"
    after = TRANSFERRED.snapshot()  # what /metrics exports as trainforge_objectstore_bytes_total
    assert (after["put"] - before["put"], after["get"] - before["get"]) == (3, 3)
    second = store.put_bytes("a/b.txt", b"second version")
    assert second.size == 14 and second.sha256 != first.sha256
    assert store.get_bytes("a/b.txt") == b"second version"
    assert store.put_bytes("empty", b"").size == 0
    assert store.get_bytes("empty") == b""


def test_missing_object_is_not_found(store, tmp_path):
    assert store.exists("nope/x") is False
    with pytest.raises(NotFound, match=r"store://nope/x does not exist"):
        store.get_bytes("nope/x")
    with pytest.raises(NotFound):
        store.get_file("nope/x", tmp_path / "dst" / "x")
    assert not (tmp_path / "dst" / "x").exists()


def test_exists_and_list_follow_path_segments(store):
    for key in ("d/x", "d/sub/y", "dd/z", "e"):
        store.put_bytes(key, key.encode())
    assert store.exists("d/x") and store.exists("e")
    assert not store.exists("d/su") and not store.exists("d/sub")
    assert sorted(i.key for i in store.list("d")) == ["d/sub/y", "d/x"]
    assert sorted(i.key for i in store.list("d/")) == ["d/sub/y", "d/x"]
    assert [(i.key, i.size) for i in store.list("d/x")] == [("d/x", 3)]
    assert store.list("d/s") == [] and store.list("missing") == []
    assert sorted(i.key for i in store.list("")) == ["d/sub/y", "d/x", "dd/z", "e"]


def test_listings_carry_sizes_but_no_sha256(store):
    store.put_bytes("l/a", b"abc")
    store.put_bytes("l/b/c", b"de")
    assert sorted((i.key, i.size, i.sha256) for i in store.list("l")) == [("l/a", 3, ""), ("l/b/c", 2, "")]
    assert [(i.key, i.size, i.sha256) for i in store.list("l/a")] == [("l/a", 3, "")]


def test_delete_prefix_removes_only_that_subtree(store):
    for key in ("run/1/a", "run/1/b/c", "run/10/a", "run/2/a"):
        store.put_bytes(key, b"x")
    assert store.delete_prefix("run/1") == 2
    assert sorted(i.key for i in store.list("run")) == ["run/10/a", "run/2/a"]
    assert not store.exists("run/1/a")
    assert store.delete_prefix("run/1") == 0
    assert store.delete_prefix("run") == 2
    assert store.list("") == []


def test_put_dir_get_dir_round_trip(store, tmp_path):
    src = tmp_path / "src"
    files = {"model.pt": os.urandom(70_000), "a/b/c.json": b"{}", "a/log.txt": b"line\n" * 100}
    for rel, data in files.items():
        write(src / rel, data)
    up = put_dir(store, "jobs/j/outputs/0/", src)
    assert sorted(i.key for i in up) == sorted(f"jobs/j/outputs/0/{rel}" for rel in files)
    down = get_dir(store, "jobs/j/outputs/0", tmp_path / "dst")
    assert sorted((i.key, i.size, i.sha256) for i in down) == sorted((i.key, i.size, i.sha256) for i in up)
    for rel, data in files.items():
        assert (tmp_path / "dst" / rel).read_bytes() == data


@pytest.mark.parametrize("key", ["", "/", "a/../b", "../x"])
def test_invalid_keys_are_rejected(store, key):
    with pytest.raises(InvalidArgument):
        store.put_bytes(key, b"x")


# --- S3 only --------------------------------------------------------------------------------------

def test_single_part_upload_carries_server_checked_sha256(s3, s3_bucket, raw_s3, tmp_path):
    data = os.urandom(1_000_000)
    info = s3.put_file("ckpt/small.bin", write(tmp_path / "small.bin", data))
    head = raw_s3.head_object(Bucket=s3_bucket, Key=f"{s3.prefix}/ckpt/small.bin", ChecksumMode="ENABLED")
    assert head["ContentLength"] == len(data)
    assert head["Metadata"]["sha256"] == info.sha256 == hashlib.sha256(data).hexdigest()
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert "-" not in head["ETag"]


@pytest.mark.slow
def test_large_file_goes_multipart_and_round_trips(request, s3_server, s3_bucket, raw_s3, unique, tmp_path):
    store = s3_store(s3_server, f"t-{unique}", multipart_threshold=8 * 2**20)
    request.addfinalizer(store.close)
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(40):
            f.write(os.urandom(2**20))
    info = store.put_file("ckpt/big.bin", src)
    assert info.size == 40 * 2**20 and info.sha256 == sha256_file(src)

    key = f"{store.prefix}/ckpt/big.bin"
    head = raw_s3.head_object(Bucket=s3_bucket, Key=key, ChecksumMode="ENABLED")
    parts = 8  # 5 MiB parts (the chunk size floor) for a 40 MiB file
    assert head["ETag"].strip('"').endswith(f"-{parts}"), head["ETag"]
    assert head["ChecksumSHA256"].endswith(f"-{parts}") and head["ChecksumType"] == "COMPOSITE"
    assert head["Metadata"]["sha256"] == info.sha256
    assert raw_s3.head_object(Bucket=s3_bucket, Key=key, PartNumber=1)["PartsCount"] == parts

    got = store.get_file("ckpt/big.bin", tmp_path / "back.bin")
    assert got == info
    assert [(i.key, i.size) for i in store.list("ckpt")] == [("ckpt/big.bin", info.size)]


def test_multipart_upload_is_checked_against_local_part_digests(request, s3_server, s3_bucket, unique, tmp_path,
                                                                monkeypatch):
    store = s3_store(s3_server, f"t-{unique}", multipart_threshold=5 * 2**20)
    request.addfinalizer(store.close)
    src = write(tmp_path / "mid.bin", os.urandom(6 * 2**20))
    assert store.put_file("mid.bin", src).size == 6 * 2**20  # two parts, verified

    real = objectstore_s3._sha256_parts

    def stale_parts(path, part_size):  # as if the file changed after it was hashed
        whole, parts = real(path, part_size)
        return whole, [hashlib.sha256(b"other").digest()] + parts[1:]

    monkeypatch.setattr(objectstore_s3, "_sha256_parts", stale_parts)
    with pytest.raises(StoreError, match=r"upload of mid2.bin did not verify: stored SHA-256 checksum"):
        store.put_file("mid2.bin", src)


def test_single_part_upload_with_wrong_digest_is_refused_by_the_server(s3, tmp_path, monkeypatch):
    src = write(tmp_path / "f.bin", b"actual bytes")
    monkeypatch.setattr(objectstore_s3, "_sha256_parts",
                        lambda path, part_size: (hashlib.sha256(b"other bytes").digest(), []))
    with pytest.raises(StoreError, match=r"failed to upload f.bin: BadDigest"):
        s3.put_file("f.bin", src)


def test_download_that_does_not_match_the_recorded_sha256_fails(s3, s3_bucket, raw_s3, tmp_path):
    raw_s3.put_object(Bucket=s3_bucket, Key=f"{s3.prefix}/bad.bin", Body=b"payload",
                      Metadata={"sha256": hashlib.sha256(b"something else").hexdigest()})
    with pytest.raises(StoreError, match=r"download of bad.bin did not verify"):
        s3.get_file("bad.bin", tmp_path / "bad.bin")
    assert list(tmp_path.iterdir()) == [], "a failed download leaves nothing behind"
    with pytest.raises(StoreError, match=r"did not verify"):
        s3.get_bytes("bad.bin")
    # an object written by someone else without our metadata is checked by size only
    raw_s3.put_object(Bucket=s3_bucket, Key=f"{s3.prefix}/foreign.bin", Body=b"foreign")
    assert s3.get_file("foreign.bin", tmp_path / "foreign.bin").sha256 == hashlib.sha256(b"foreign").hexdigest()


@pytest.mark.parametrize("access_key,secret_key", [("tf-admin", "wrong-secret"), ("nobody", "wrong-secret")],
                         ids=["wrong-secret", "unknown-key"])
def test_wrong_credentials_are_rejected_with_a_clear_error(s3_server, s3_bucket, s3, access_key, secret_key,
                                                           tmp_path):
    s3.put_bytes("secret.txt", b"x")
    refused = r"refused the credentials \(access key '" + access_key + r"'\)"
    with pytest.raises(StoreError, match=refused + r" when trying to open bucket") as exc:
        s3_store(s3_server, "", access_key=access_key, secret_key=secret_key, create_bucket=True)
    assert "s3_access_key / s3_secret_key" in str(exc.value) and secret_key not in str(exc.value)
    with pytest.raises(StoreError, match=refused):
        open_store(f"s3://{s3_bucket}/x", endpoint=s3_server.extra["endpoint"], access_key=access_key,
                   secret_key=secret_key)
    bad = s3_store(s3_server, s3.prefix, access_key=access_key, secret_key=secret_key)
    try:
        with pytest.raises(StoreError, match=refused + r" when trying to upload"):
            bad.put_bytes("other.txt", b"x")
        with pytest.raises(StoreError, match=refused + r" when trying to download"):
            bad.get_bytes("secret.txt")
        with pytest.raises(StoreError, match=refused):
            bad.get_file("secret.txt", tmp_path / "s")
        with pytest.raises(StoreError, match=refused):
            bad.exists("secret.txt")
        with pytest.raises(StoreError, match=refused + r" when trying to list"):
            bad.list("")
        with pytest.raises(StoreError, match=refused):
            bad.delete_prefix("")
    finally:
        bad.close()
    assert s3.exists("secret.txt") and not s3.exists("other.txt")


def test_missing_bucket_and_unreachable_endpoint_are_store_errors(s3_server):
    missing = S3Store("tf-no-such-bucket", endpoint=s3_server.extra["endpoint"],
                      access_key=s3_server.extra["access_key"], secret_key=s3_server.extra["secret_key"])
    try:
        with pytest.raises(StoreError, match=r"bucket s3://tf-no-such-bucket at http://127\.0\.0\.1:\d+ does not exist"):
            missing.get_bytes("x")
    finally:
        missing.close()
    down = S3Store(BUCKET, endpoint=f"http://127.0.0.1:{free_port()}", access_key="a", secret_key="b",
                   connect_timeout=1)
    try:
        with pytest.raises(StoreError, match=r"cannot reach object store s3://tf-tests at http://127\.0\.0\.1"):
            down.put_bytes("x", b"x")
    finally:
        down.close()


def test_open_store_passes_s3_options(s3_server, s3_bucket, unique):
    store = open_store(f"s3://{s3_bucket}/t-{unique}", endpoint=s3_server.extra["endpoint"],
                       access_key=s3_server.extra["access_key"], secret_key=s3_server.extra["secret_key"],
                       multipart_threshold=16 * 2**20)
    try:
        assert isinstance(store, S3Store) and store.transfer_config.multipart_threshold == 16 * 2**20
        store.put_bytes("k", b"v")
        assert store.get_bytes("k") == b"v" and [i.key for i in store.list("")] == ["k"]
    finally:
        store.close()

"""Objects in an S3 bucket (boto3): the only module that imports boto3, botocore or s3transfer.

Imported lazily by `open_store` for `s3://` URLs, so a process using the
local store never loads boto3.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import botocore.exceptions
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from s3transfer.utils import ChunksizeAdjuster

from trainforge_services.common.contracts.storekeys import uri_for
from trainforge_services.common.errors import InvalidArgument, NotFound, TrainforgeError

from .base import TRANSFERRED, ObjectInfo, PutBytesViaFile, StoreError, sha256_file


class S3Store(PutBytesViaFile):
    """Objects in an S3 bucket under a key prefix.

    Uploads are verified three ways before `put_file` returns: the stored size,
    the SHA-256 kept as object metadata (`x-amz-meta-sha256`, what downloads
    are checked against), and - with `checksums` on (the default) - S3's own
    SHA-256 checksum, which the server computes and checks on receipt. A
    single-request upload sends the file's precomputed SHA-256, so the server
    rejects any other bytes; a multipart upload (files of `multipart_threshold`
    bytes or more) sends a SHA-256 per part and the stored composite checksum
    (SHA-256 of the part digests, "-<parts>") is compared with the one computed
    locally. Turn `checksums` off only for servers without flexible checksums.
    Downloads land in a temporary file and are moved into place only once size
    and SHA-256 match the metadata. Listings carry no SHA-256 (sha256 is "").
    """

    def __init__(self, bucket: str, prefix: str = "", *, endpoint: str = "", access_key: str = "",
                 secret_key: str = "", region: str = "us-east-1", multipart_threshold: int = 64 * 2**20,
                 multipart_chunksize: int = 0, max_concurrency: int = 8, checksums: bool = True,
                 create_bucket: bool = False, connect_timeout: float = 10, read_timeout: float = 120):
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.endpoint, self.checksums = endpoint, checksums
        self._access_key = access_key
        self._s3 = boto3.client(
            "s3", endpoint_url=endpoint or None, aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None, region_name=region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3, "mode": "standard"},
                          connect_timeout=connect_timeout, read_timeout=read_timeout,
                          max_pool_connections=max(10, max_concurrency + 2),
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"),
        )
        self.transfer_config = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize or max(5 * 2**20, multipart_threshold // 4),
            max_concurrency=max_concurrency)
        if create_bucket:
            self._ensure_bucket()

    def close(self) -> None:
        self._s3.close()

    def _ensure_bucket(self) -> None:
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except botocore.exceptions.ClientError as e:
            if _code(e) not in ("404", "NoSuchBucket", "NotFound"):
                raise self._error("open bucket", self.bucket, e) from None
            try:
                self._s3.create_bucket(Bucket=self.bucket)
            except botocore.exceptions.ClientError as e2:
                if _code(e2) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise self._error("create bucket", self.bucket, e2) from None
            except botocore.exceptions.BotoCoreError as e2:
                raise self._error("create bucket", self.bucket, e2) from None
        except botocore.exceptions.BotoCoreError as e:
            raise self._error("open bucket", self.bucket, e) from None

    def _k(self, key: str) -> str:
        key = key.strip("/")
        if not key or ".." in key.split("/"):
            raise InvalidArgument(f"invalid object key {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _unk(self, full: str) -> str:
        return full[len(self.prefix) + 1:] if self.prefix else full

    def _error(self, what: str, key: str, e: BaseException) -> TrainforgeError:
        where = f"s3://{self.bucket}" + (f" at {self.endpoint}" if self.endpoint else "")
        if isinstance(e, botocore.exceptions.ClientError):
            code = _code(e)
            if code in ("404", "NoSuchKey", "NotFound"):
                return NotFound(f"object {uri_for(key)} does not exist")
            if code == "NoSuchBucket":
                return StoreError(f"bucket {where} does not exist (while trying to {what} {key})")
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "AccessDenied",
                        "InvalidToken", "ExpiredToken", "AuthorizationHeaderMalformed"):
                return StoreError(
                    f"object store {where} refused the credentials (access key {self._access_key!r}) "
                    f"when trying to {what} {key}: {code}; check s3_access_key / s3_secret_key and "
                    f"that the key may access the bucket")
            if code in ("BadDigest", "XAmzContentSHA256Mismatch", "InvalidDigest"):
                return StoreError(f"object store {where} failed to {what} {key}: {code}: the bytes it received "
                                  f"do not match the checksum sent (file changed while uploading, or corrupted "
                                  f"in transit)")
            return StoreError(f"object store {where} failed to {what} {key}: {code}: "
                              f"{e.response.get('Error', {}).get('Message', e)}")
        if isinstance(e, (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError)):
            return StoreError(f"cannot reach object store {where} to {what} {key}: {e}")
        return StoreError(f"object store {where} failed to {what} {key}: {e}")

    def _head(self, what: str, key: str) -> dict:
        try:
            return self._s3.head_object(Bucket=self.bucket, Key=self._k(key), ChecksumMode="ENABLED")
        except _S3_ERRORS as e:
            raise self._error(what, key, e) from None

    def _part_size(self, size: int) -> int:
        return ChunksizeAdjuster().adjust_chunksize(self.transfer_config.multipart_chunksize, size)

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        path, full = Path(path), self._k(key)
        size = path.stat().st_size
        multipart = size >= self.transfer_config.multipart_threshold
        digest, parts = _sha256_parts(path, self._part_size(size) if multipart else 0)
        want = ObjectInfo(key.strip("/"), size, digest.hex())
        extra: dict = {"Metadata": {"sha256": want.sha256}}
        expected_checksum = ""
        if self.checksums and multipart:
            extra["ChecksumAlgorithm"] = "SHA256"
            expected_checksum = f"{_b64(hashlib.sha256(b''.join(parts)).digest())}-{len(parts)}"
        elif self.checksums:
            extra["ChecksumSHA256"] = expected_checksum = _b64(digest)
        try:
            self._s3.upload_file(str(path), self.bucket, full, Config=self.transfer_config, ExtraArgs=extra)
        except boto3.exceptions.S3UploadFailedError as e:  # wraps the ClientError (as its context)
            inner = e.__cause__ or e.__context__
            raise self._error("upload", key, inner if isinstance(inner, _S3_ERRORS) else e) from None
        except _S3_ERRORS as e:
            raise self._error("upload", key, e) from None
        head = self._head("verify upload of", key)
        got = ObjectInfo(want.key, head["ContentLength"], head.get("Metadata", {}).get("sha256", ""))
        if got != want:
            raise StoreError(f"upload of {key} did not verify: stored {got}, local {want}")
        if self.checksums and head.get("ChecksumSHA256") != expected_checksum:
            raise StoreError(f"upload of {key} did not verify: stored SHA-256 checksum "
                             f"{head.get('ChecksumSHA256')!r}, expected {expected_checksum!r} "
                             f"(a server without SHA-256 checksums needs checksums=False)")
        TRANSFERRED.add("put", size)
        return want

    @staticmethod
    def _expect(head: dict) -> tuple[int, str]:
        return head["ContentLength"], head.get("Metadata", {}).get("sha256", "")

    def get_file(self, key: str, path: Path) -> ObjectInfo:
        path = Path(path)
        size, sha = self._expect(self._head("download", key))  # also: NotFound before touching path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.download-")
        os.close(fd)
        try:
            try:
                self._s3.download_file(self.bucket, self._k(key), tmp, Config=self.transfer_config)
            except _S3_ERRORS as e:
                raise self._error("download", key, e) from None
            got = ObjectInfo(key.strip("/"), Path(tmp).stat().st_size, sha256_file(Path(tmp)))
            _check_download(key, got, size, sha)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        TRANSFERRED.add("get", got.size)
        return got

    def get_bytes(self, key: str) -> bytes:
        try:
            resp = self._s3.get_object(Bucket=self.bucket, Key=self._k(key))
            data = resp["Body"].read()
        except _S3_ERRORS as e:
            raise self._error("download", key, e) from None
        got = ObjectInfo(key.strip("/"), len(data), hashlib.sha256(data).hexdigest())
        _check_download(key, got, *self._expect(resp))
        TRANSFERRED.add("get", len(data))
        return data

    def info(self, key: str) -> ObjectInfo:
        size, sha = self._expect(self._head("look up", key))
        return ObjectInfo(key.strip("/"), size, sha)

    def iter_bytes(self, key: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        try:
            body = self._s3.get_object(Bucket=self.bucket, Key=self._k(key))["Body"]
        except _S3_ERRORS as e:
            raise self._error("download", key, e) from None

        def chunks() -> Iterator[bytes]:
            try:
                for block in body.iter_chunks(chunk):
                    TRANSFERRED.add("get", len(block))
                    yield block
            except _S3_ERRORS as e:
                raise self._error("download", key, e) from None
            finally:
                body.close()

        return chunks()

    def presign(self, key: str, expires: int) -> str | None:
        try:
            return self._s3.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._k(key)}, ExpiresIn=int(expires))
        except _S3_ERRORS as e:
            raise self._error("presign", key, e) from None

    def presign_put(self, key: str, expires: int, sha256: str) -> tuple[str, dict[str, str]]:
        """A PUT URL for `key` valid `expires` s, and the headers the PUT must send: the SHA-256 metadata
        downloads are checked against is signed into the URL, so no other value can be stored with it."""
        try:
            url = self._s3.generate_presigned_url(
                "put_object", Params={"Bucket": self.bucket, "Key": self._k(key), "Metadata": {"sha256": sha256}},
                ExpiresIn=int(expires))
        except _S3_ERRORS as e:
            raise self._error("presign", key, e) from None
        return url, {"x-amz-meta-sha256": sha256}

    def list(self, prefix: str) -> list[ObjectInfo]:
        """The object named prefix and every object under prefix/, like a directory walk."""
        stripped = prefix.strip("/")
        full = self._k(stripped) if stripped else self.prefix
        out = []
        try:
            for page in self._s3.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=f"{full}/" if full and not stripped else full):
                for obj in page.get("Contents", []):
                    k = obj["Key"]
                    if not full or k == full or k.startswith(full + "/"):
                        out.append(ObjectInfo(self._unk(k), obj["Size"], ""))
        except _S3_ERRORS as e:
            raise self._error("list", stripped or "/", e) from None
        return out

    def exists(self, key: str) -> bool:
        try:
            self._head("check", key)
            return True
        except NotFound:
            return False

    def delete_prefix(self, prefix: str) -> int:
        items = self.list(prefix)
        for i in range(0, len(items), 1000):
            chunk = [{"Key": self._k(o.key)} for o in items[i:i + 1000]]
            try:
                resp = self._s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
            except _S3_ERRORS as e:
                raise self._error("delete under", prefix, e) from None
            if resp.get("Errors"):
                first = resp["Errors"][0]
                raise StoreError(f"object store could not delete {len(resp['Errors'])} object(s) under "
                                 f"{uri_for(prefix)}: {first.get('Key')}: {first.get('Code')} {first.get('Message')}")
        return len(items)


_S3_ERRORS = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)


def _code(e: botocore.exceptions.ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _sha256_parts(path: Path, part_size: int, block: int = 1 << 20) -> tuple[bytes, list[bytes]]:
    """SHA-256 of the whole file and, with part_size, of each part_size slice.

    The part digests are computed on a second thread (hashlib drops the GIL),
    so a multipart upload's local hashing costs about one pass, not two.
    """
    if not part_size:
        return bytes.fromhex(sha256_file(path, block)), []
    with ThreadPoolExecutor(1) as pool:
        parts = pool.submit(_part_digests, path, part_size, block)
        whole = bytes.fromhex(sha256_file(path, block))
        return whole, parts.result()


def _part_digests(path: Path, part_size: int, block: int) -> list[bytes]:
    out = []
    with open(path, "rb") as f:
        while True:
            h, left = hashlib.sha256(), part_size
            while left and (data := f.read(min(block, left))):
                h.update(data)
                left -= len(data)
            if left == part_size:
                return out
            out.append(h.digest())


def _check_download(key: str, got: ObjectInfo, size: int, sha256: str) -> None:
    if got.size != size or (sha256 and got.sha256 != sha256):
        raise StoreError(f"download of {key} did not verify: got {got.size} bytes sha256 {got.sha256}, "
                         f"object has {size} bytes sha256 {sha256 or '(not recorded)'}")

"""Object storage behind one interface: a local directory (`local.py`) or S3 (`s3.py`).

`base.py` holds the interface and what both stores share; `open_store` /
`store_from_settings` pick the store from a URL. `s3.py` is imported only
when an `s3://` store is opened (or `S3Store` is asked for by name), so
importing this package never imports boto3.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from trainforge_services.common.contracts.storekeys import SCHEME, key_from_uri, uri_for
from trainforge_services.common.errors import InvalidArgument

from .base import (
    ObjectInfo,
    ObjectStore,
    PutBytesViaFile,
    StoreError,
    get_dir,
    objects_under,
    put_dir,
    safe_relative,
    sha256_file,
)
from .local import LocalStore

if TYPE_CHECKING:
    from .s3 import S3Store as S3Store

# S3Store is public too, but left out here so that `import *` never loads boto3 (see __getattr__).
__all__ = ["SCHEME", "LocalStore", "ObjectInfo", "ObjectStore", "PutBytesViaFile", "StoreError",
           "get_dir", "key_from_uri", "objects_under", "open_store", "put_dir", "safe_relative", "sha256_file",
           "store_from_settings", "uri_for"]


def __getattr__(name: str) -> Any:
    # `from trainforge_services.common.adapters.objectstore import S3Store` keeps working, loading boto3 only then.
    if name == "S3Store":
        from .s3 import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(url: str, *, endpoint: str = "", access_key: str = "", secret_key: str = "",
               region: str = "us-east-1", **s3_options) -> ObjectStore:
    """file:///dir -> LocalStore; s3://bucket/prefix -> S3Store (s3_options go to S3Store)."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return LocalStore(Path(unquote(parsed.path)))
    if parsed.scheme == "s3":
        from .s3 import S3Store  # here, not at the top: boto3 is loaded only for S3

        return S3Store(parsed.netloc, parsed.path, endpoint=endpoint, access_key=access_key,
                       secret_key=secret_key, region=region, create_bucket=True, **s3_options)
    raise InvalidArgument(f"object store URL {url!r} must start with file:// or s3://")


def store_from_settings(settings) -> ObjectStore:  # noqa: ANN001 - any StoreSettings
    return open_store(settings.objectstore(), endpoint=settings.s3_endpoint, access_key=settings.s3_access_key,
                      secret_key=settings.s3_secret_key, region=settings.s3_region)

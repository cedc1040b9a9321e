"""MongoDB connections (pymongo); the only module that imports pymongo.

Stores (the Trainer's job store, the API's identity store) take a
`Database` from `connect()` and use the re-exported names below, so that
they do not import pymongo themselves.

pymongo's errors stop here: `mapped_errors()` (a context manager) and
`mapped` (a decorator for a store's methods) turn a `PyMongoError` into the
domain error it means (services/common/errors.py), so no caller above a
store handles a driver exception. A lost connection or a timeout is
`Unavailable` (retrying later may succeed), a duplicate key `Conflict`
(a store that gives a unique index a meaning of its own catches
`DuplicateKeyError` first), any other failure a plain `TrainforgeError`.
The message a client gets is one short sentence naming the store ("job
store unavailable; retry shortly"): the driver's own text (addresses,
timeouts, topology) is logged here, in the service's log, and nowhere else.

Known quirk of the embedded MongoDB-wire server (nx-27017): `$push` of a
sub-document stores it (and the array's other elements) as JSON strings.
Stores therefore keep histories as sub-documents keyed by a sortable
sequence (`$set: {"history.<seq>": {...}}`), which both servers handle.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pymongo
from bson import ObjectId
from bson.errors import InvalidId
from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import (
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    NetworkTimeout,
    PyMongoError,
    ServerSelectionTimeoutError,
    WTimeoutError,
)

from trainforge_services.common.errors import Conflict, TrainforgeError, Unavailable

__all__ = ["ASCENDING", "DESCENDING", "ReturnDocument", "Collection", "Database", "DuplicateKeyError", "InvalidId",
           "ObjectId",
           "PyMongoError", "connect", "mapped", "mapped_as", "mapped_errors", "translate"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
# The driver's ways of saying "not now": the server cannot be reached or did not answer in time.
_UNAVAILABLE = (ConnectionFailure, ServerSelectionTimeoutError, NetworkTimeout, ExecutionTimeout, WTimeoutError)


def connect(url: str, db: str, timeout_ms: int = 5000) -> Database:
    client = pymongo.MongoClient(url, serverSelectionTimeoutMS=timeout_ms, tz_aware=True, connect=False)
    return client[db]


def translate(e: PyMongoError, what: str = "MongoDB") -> TrainforgeError:
    """The domain error a driver error means; `what` names the store in the message."""
    if isinstance(e, DuplicateKeyError):
        # the unique index at fault names the fields (servers that do not say: the id)
        fields = list((e.details or {}).get("keyPattern") or {}) or ["_id"]
        return Conflict(f"{what}: a record with this {', '.join(fields)} already exists",
                        details=[{"field": f, "message": "already taken"} for f in fields])
    if isinstance(e, _UNAVAILABLE) or getattr(e, "timeout", False):
        log.warning("%s unavailable: %s: %s", what, type(e).__name__, e)
        return Unavailable(f"{what} unavailable; retry shortly")
    log.error("%s failed: %s: %s", what, type(e).__name__, e)
    return TrainforgeError(f"{what} failed; the details are in the service's log")


@contextlib.contextmanager
def mapped_errors(what: str = "MongoDB") -> Iterator[None]:
    try:
        yield
    except PyMongoError as e:
        raise translate(e, what) from None


def mapped_as(what: str) -> Callable[[F], F]:
    """A decorator for a store's methods: driver errors leave them as domain errors naming `what`."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with mapped_errors(what):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


mapped = mapped_as("MongoDB")


def ping(database: Database) -> None:
    """Unavailable when MongoDB cannot be reached (whatever the driver says went wrong)."""
    try:
        database.command("ping")
    except PyMongoError as e:
        log.warning("MongoDB unavailable: %s: %s", type(e).__name__, e)
        raise Unavailable("MongoDB unavailable; retry shortly") from None

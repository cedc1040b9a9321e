"""MongoDB connections (pymongo); the only module that imports pymongo.

Stores (the Trainer's job store, the API's identity store) take a
`Database` from `connect()` and use the re-exported names below, so that
they do not import pymongo themselves.

Known quirk of the embedded MongoDB-wire server (nx-27017): `$push` of a
sub-document stores it (and the array's other elements) as JSON strings.
Stores therefore keep histories as sub-documents keyed by a sortable
sequence (`$set: {"history.<seq>": {...}}`), which both servers handle.
"""

from __future__ import annotations

import pymongo
from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError, PyMongoError

from services.common.errors import Unavailable

__all__ = ["ASCENDING", "DESCENDING", "ReturnDocument", "Collection", "Database", "DuplicateKeyError",
           "PyMongoError", "connect"]


def connect(url: str, db: str, timeout_ms: int = 5000) -> Database:
    client = pymongo.MongoClient(url, serverSelectionTimeoutMS=timeout_ms, tz_aware=True, connect=False)
    return client[db]


def ping(database: Database) -> None:
    try:
        database.command("ping")
    except PyMongoError as e:
        raise Unavailable(f"MongoDB unavailable: {e}") from None

"""MongoDB's driver errors become domain errors at the adapter, and a store never lets one out."""

from __future__ import annotations

import pytest
from pymongo.errors import (
    AutoReconnect,
    DuplicateKeyError,
    ExecutionTimeout,
    NetworkTimeout,
    OperationFailure,
    ServerSelectionTimeoutError,
)

from services.common.adapters import mongo
from services.common.errors import Conflict, TrainforgeError, Unavailable
from services.common.states import JobState
from services.trainer.quotas import QuotaStore
from services.trainer.store import JobStore


@pytest.mark.parametrize("error", [ServerSelectionTimeoutError("no servers"), AutoReconnect("reset"),
                                   NetworkTimeout("timed out"), ExecutionTimeout("maxTimeMS")])
def test_outages_and_timeouts_are_unavailable(error):
    assert type(mongo.translate(error, "the job store")) is Unavailable
    assert mongo.translate(error, "the job store").message.startswith("the job store unavailable")


def test_a_duplicate_key_is_a_conflict_and_anything_else_internal():
    assert type(mongo.translate(DuplicateKeyError("E11000"))) is Conflict
    other = mongo.translate(OperationFailure("bad $set"))
    assert type(other) is TrainforgeError and "bad $set" in other.message


def test_mapped_errors_raise_the_domain_error_without_the_driver_one_attached():
    with pytest.raises(Unavailable) as err, mongo.mapped_errors("quotas"):
        raise AutoReconnect("connection reset")
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_store_without_a_server_raises_unavailable():
    db = mongo.connect("mongodb://127.0.0.1:9", "nowhere", timeout_ms=100)
    try:
        with pytest.raises(Unavailable, match="MongoDB unavailable"):
            JobStore(db).find("j1")
        with pytest.raises(Unavailable):
            JobStore(db).in_states([JobState.QUEUED])
        with pytest.raises(Unavailable):
            QuotaStore(db).get("t")
    finally:
        db.client.close()


def test_a_duplicate_key_names_the_fields_of_the_index_at_fault():
    error = DuplicateKeyError("E11000", details={"keyPattern": {"team": 1, "idempotency_key": 1}})
    conflict = mongo.translate(error, "the job store")
    assert conflict.message == "the job store: a record with this team, idempotency_key already exists"
    assert [d["field"] for d in conflict.details] == ["team", "idempotency_key"]

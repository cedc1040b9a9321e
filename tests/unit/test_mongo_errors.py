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

from trainforge_services.common.adapters import mongo
from trainforge_services.common.errors import Conflict, TrainforgeError, Unavailable
from trainforge_services.common.states import JobState
from trainforge_services.trainer.quotas import QuotaStore
from trainforge_services.trainer.store import JobStore


@pytest.mark.parametrize("error", [ServerSelectionTimeoutError("no servers"), AutoReconnect("reset"),
                                   NetworkTimeout("timed out"), ExecutionTimeout("maxTimeMS")])
def test_outages_and_timeouts_are_unavailable(error):
    assert type(mongo.translate(error, "the job store")) is Unavailable
    assert mongo.translate(error, "the job store").message == "the job store unavailable; retry shortly"


def test_a_duplicate_key_is_a_conflict_and_anything_else_internal(caplog):
    assert type(mongo.translate(DuplicateKeyError("E11000"))) is Conflict
    other = mongo.translate(OperationFailure("bad $set"))
    # the driver's text goes to the service's log only, never into what a client reads
    assert type(other) is TrainforgeError and "bad $set" not in other.message
    assert "bad $set" in caplog.text


def test_an_outage_reaches_clients_as_one_short_sentence_and_the_details_only_the_log(caplog):
    error = ServerSelectionTimeoutError("127.0.0.1:9: [Errno 111] Connection refused, Timeout: 0.1s, "
                                        "Topology Description: <TopologyDescription id: 1, ...>")
    err = mongo.translate(error, "job store")
    assert err.message == "job store unavailable; retry shortly" and not err.details
    assert "Topology Description" in caplog.text and "127.0.0.1:9" in caplog.text


def test_mapped_errors_raise_the_domain_error_without_the_driver_one_attached():
    with pytest.raises(Unavailable) as err, mongo.mapped_errors("quotas"):
        raise AutoReconnect("connection reset")
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_store_without_a_server_raises_unavailable():
    db = mongo.connect("mongodb://127.0.0.1:9", "nowhere", timeout_ms=100)
    try:
        with pytest.raises(Unavailable, match=r"^job store unavailable; retry shortly$"):
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

"""A stored job as the wire sees it: one conversion, stable order."""

import json

from protos import common_pb2
from services.common.states import JobState, LearnerState
from services.trainer.servicer import job_to_proto, learners_to_doc


def stored_job() -> dict:
    return {
        "_id": "j-1", "team": "t", "name": "mnist", "state": int(JobState.RUNNING), "reason": "all started",
        "queue_position": 0, "manifest": {"name": "mnist", "learners": 2}, "code_uri": "store://c",
        "attempt": 1, "created_at": 100.5, "updated_at": 101.25, "outputs_uri": "", "submitted_by": "k1",
        # keys sort in time order; insertion order here is deliberately scrambled
        "history": {
            "00000000000000000003aaaa": {"from": 2, "to": 3, "reason": "reserved", "actor": "trainer",
                                         "ts": 3.0},
            "00000000000000000001aaaa": {"from": 0, "to": 1, "reason": "submitted", "actor": "k1", "ts": 1.0},
            "00000000000000000002aaaa": {"from": 1, "to": 2, "reason": "admitted", "actor": "trainer",
                                         "ts": 2.0},
        },
        "learners": {
            "10": {"rank": 10, "state": 2, "exit_code": 0, "attempt": 1, "message": ""},
            "2": {"rank": 2, "state": 2, "exit_code": 0, "attempt": 1, "message": "up"},
        },
    }


def test_job_to_proto_sorts_history_by_key_and_learners_by_rank():
    job = job_to_proto(stored_job())
    assert [(e.from_state, e.to_state) for e in job.history] == [(0, 1), (1, 2), (2, 3)]
    assert [e.actor for e in job.history] == ["k1", "trainer", "trainer"]
    assert [learner.rank for learner in job.learners] == [2, 10]
    assert job.learners[0].message == "up"


def test_job_to_proto_carries_every_field():
    job = job_to_proto(stored_job())
    assert (job.id, job.team, job.name, job.state, job.reason) == ("j-1", "t", "mnist", JobState.RUNNING,
                                                                   "all started")
    assert json.loads(job.manifest_json) == {"name": "mnist", "learners": 2}
    assert (job.created_at, job.updated_at, job.history[2].timestamp) == (100.5, 101.25, 3.0)
    assert (job.code_uri, job.submitted_by, job.attempt) == ("store://c", "k1", 1)


def test_learners_round_trip_keyed_by_rank_string():
    reported = [common_pb2.LearnerStatus(rank=1, state=LearnerState.LEARNER_FAILED, exit_code=3, attempt=2,
                                         message="boom")]
    doc = learners_to_doc(reported)
    assert doc == {"1": {"rank": 1, "state": int(LearnerState.LEARNER_FAILED), "exit_code": 3, "attempt": 2,
                         "message": "boom"}}
    assert list(job_to_proto({**stored_job(), "learners": doc}).learners) == reported

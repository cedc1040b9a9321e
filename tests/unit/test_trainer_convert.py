"""A stored job as the wire sees it: one conversion, stable order."""

import json

from trainforge_protos import common_pb2
from trainforge_services.common.states import JobState, LearnerState
from trainforge_services.trainer.grpc_api import job_to_proto, learners_from_proto
from trainforge_services.trainer.record import JobRecord, LearnerReport, StatusEvent


def stored_job() -> JobRecord:
    return JobRecord(
        id="j-1", team="t", name="mnist", state=JobState.RUNNING, reason="all started", queue_position=0,
        manifest={"name": "mnist", "learners": 2}, code_uri="store://c", attempt=1, created_at=100.5,
        updated_at=101.25, outputs_uri="", submitted_by="k1",
        history=(StatusEvent(from_state=JobState.JOB_STATE_UNSPECIFIED, to_state=JobState.PENDING,
                             reason="submitted", actor="k1", ts=1.0),
                 StatusEvent(from_state=JobState.PENDING, to_state=JobState.QUEUED, reason="admitted",
                             actor="trainer", ts=2.0),
                 StatusEvent(from_state=JobState.QUEUED, to_state=JobState.DEPLOYING, reason="reserved",
                             actor="trainer", ts=3.0)),
        # keyed by rank strings; insertion order here is deliberately scrambled
        learners={"10": LearnerReport(rank=10, state=2, attempt=1),
                  "2": LearnerReport(rank=2, state=2, attempt=1, message="up")},
    )


def test_job_to_proto_keeps_history_order_and_sorts_learners_by_rank():
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
                                         message="boom", timed_out=True)]
    learners = learners_from_proto(reported)
    assert learners == {"1": LearnerReport(rank=1, state=int(LearnerState.LEARNER_FAILED), exit_code=3, attempt=2,
                                           message="boom", timed_out=True)}
    assert list(job_to_proto(stored_job().model_copy(update={"learners": learners})).learners) == reported


def test_the_learners_isolation_survives_the_trainer_and_reaches_the_api():
    from trainforge_services.api.trainer_client import learner_to_json

    reported = [common_pb2.LearnerStatus(rank=0, state=LearnerState.LEARNER_RUNNING, attempt=1, isolation="sandbox")]
    learners = learners_from_proto(reported)
    assert learners["0"].isolation == "sandbox"
    wire = list(job_to_proto(stored_job().model_copy(update={"learners": learners})).learners)
    assert wire == reported
    assert learner_to_json(wire[0])["isolation"] == "sandbox"
    assert "warning" not in learner_to_json(wire[0])


def test_a_learner_without_isolation_says_plainly_that_it_is_not_isolated():
    from trainforge_services.api.schemas import Learner
    from trainforge_services.api.trainer_client import learner_to_json

    shown = learner_to_json(common_pb2.LearnerStatus(rank=0, state=LearnerState.LEARNER_RUNNING, attempt=1,
                                                     isolation="none"))
    assert shown["warning"].startswith("NOT isolated: ") and "read the platform's credentials and files" in \
        shown["warning"]
    assert Learner.model_validate(shown).warning == shown["warning"]  # the REST shape carries it


def test_an_unknown_capacity_says_why_and_has_nothing_free():
    from trainforge_services.api.trainer_client import cluster_to_json
    from trainforge_services.trainer.accounting import ClusterView
    from trainforge_services.trainer.grpc_api import cluster_to_proto
    from trainforge_services.trainer.resources import Usage

    view = ClusterView(capacity=None, unknown_reason="the LCM is unreachable", held=Usage(cpus=2.0, learners=1),
                       active_jobs=1, queued_jobs=3)
    wire = cluster_to_json(cluster_to_proto(view))
    assert wire == {"backend": "", "known": False, "unknown_reason": "the LCM is unreachable", "capacity": None,
                    "held": {"gpus": 0, "cpus": 2.0, "memory": 0, "learners": 1}, "free": None,
                    "active_jobs": 1, "queued_jobs": 3, "network_policy": ""}

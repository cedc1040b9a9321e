"""Quotas and usage without a database: validation, documents, wire conversions, the per-team tally."""

import math

import pytest

from trainforge_protos import trainer_pb2
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.common.states import JobState
from trainforge_services.trainer import accounting, quotas, storedocs
from trainforge_services.trainer.grpc_api import quota_from_proto, quota_to_proto, usage_to_proto
from trainforge_services.trainer.record import JobRecord
from trainforge_services.trainer.resources import Quota, TeamUse, Usage

GI = 2**30


def test_a_quota_round_trips_through_its_document_keeping_unset_limits_unset():
    quota = Quota(gpus=0, cpus=2.5, gpus_by_type={"a100": 2})
    doc = storedocs.quota_doc(quota)
    assert doc == {"gpus": 0, "cpus": 2.5, "gpus_by_type": {"a100": 2}}
    assert storedocs.quota_of(doc) == quota
    assert storedocs.quota_of({}) == Quota()


def test_quota_validation_names_every_bad_field():
    bad = Quota(gpus=-1, cpus=math.nan, memory=2**63, jobs=-2, gpus_by_type={"A100": 1, "h100": -1})
    with pytest.raises(InvalidArgument) as err:
        quotas.validate("", bad)
    assert [d["field"] for d in err.value.details] == [
        "team", "quota.gpus", "quota.cpus", "quota.memory", "quota.jobs", "quota.gpus_by_type.A100",
        "quota.gpus_by_type.h100"]
    quotas.validate("t", Quota(gpus=0, cpus=0.5, memory=GI, jobs=0, gpus_by_type={"a100-80g": 0}))


def test_the_wire_tells_an_unset_limit_from_a_zero():
    message = trainer_pb2.Quota(gpus=0, memory=4 * GI, gpus_by_type={"a100": 2})
    quota = quota_from_proto(message)
    assert quota == Quota(gpus=0, memory=4 * GI, gpus_by_type={"a100": 2})
    back = quota_to_proto(quota)
    assert back.HasField("gpus") and not back.HasField("cpus") and not back.HasField("jobs")
    assert back == message


def test_usage_sets_every_in_use_field():
    report = accounting.TeamReport("t", Quota(jobs=3), TeamUse(), queued_jobs=2)
    wire = usage_to_proto(report)
    assert all(wire.in_use.HasField(name) for name in ("gpus", "cpus", "memory", "jobs"))
    assert (wire.team, wire.quota.jobs, wire.queued_jobs, wire.active_jobs) == ("t", 3, 2, 0)
    assert not wire.quota.HasField("gpus")


def row(team: str, state: JobState, *, gpus: int = 0, cpus: float = 1.0, gpu_type: str = "",
        active_since: float | None = None, gpu_seconds: float = 0.0, cpu_seconds: float = 0.0) -> JobRecord:
    return JobRecord(id=f"{team}-{state.name}", team=team, state=state, resources=Usage(gpus, cpus, GI, 1),
                     gpu_type=gpu_type, active_since=active_since, gpu_seconds=gpu_seconds,
                     cpu_seconds=cpu_seconds)


def test_reports_tally_holdings_queues_and_seconds_per_team():
    rows = [
        row("a", JobState.COMPLETED, gpus=2, gpu_seconds=20.0, cpu_seconds=10.0, active_since=50.0),
        row("a", JobState.RUNNING, gpus=2, cpus=2, gpu_type="a100", active_since=90.0, gpu_seconds=4.0),
        row("a", JobState.QUEUED, gpus=1),
        row("b", JobState.HALTED, gpus=1, gpu_seconds=7.0, active_since=10.0),
    ]
    reports = accounting.reports(rows, {"c": Quota(gpus=1)}, now=100.0)
    assert [r.team for r in reports] == ["a", "b", "c"]
    a, b, c = reports
    assert a.held == TeamUse(Usage(2, 2.0, GI, 1), 1, {"a100": 2})
    assert (a.active_jobs, a.queued_jobs) == (1, 1)
    # finished stints plus the one still running (10 s of 2 GPUs and 2 CPUs)
    assert (a.gpu_seconds, a.cpu_seconds) == (20.0 + 4.0 + 20.0, 10.0 + 20.0)
    assert (b.active_jobs, b.gpu_seconds) == (0, 7.0)
    assert (c.quota, c.held, c.gpu_seconds) == (Quota(gpus=1), TeamUse(), 0.0)


def test_gpu_type_must_be_a_short_lowercase_name():
    manifest = {"name": "x", "command": "true", "resources": {"gpus": 1, "gpu_type": "a100-80g"}}
    assert parse_manifest(manifest).resources.gpu_type == "a100-80g"
    assert parse_manifest({"name": "x", "command": "true"}).resources.gpu_type is None
    for bad in ("A100", "a100_80", "x" * 33, ""):
        with pytest.raises(InvalidArgument) as err:
            parse_manifest({**manifest, "resources": {"gpus": 1, "gpu_type": bad}})
        assert err.value.details[0]["field"] == "resources.gpu_type"

"""Usage accounting's arithmetic (services/api/usage.py), on REST-shaped jobs with chosen histories."""

from __future__ import annotations

import csv
import io

import pytest

from trainforge_services.api import usage
from trainforge_services.common.errors import InvalidArgument

DAY = 86400


def job(job_id: str, team: str, state: str, steps: list[tuple[str, float]], *, learners: int = 1, gpus: int = 0,
        cpus: float = 1.0, memory: int = 2**30, gpu_type: str | None = None) -> dict:
    return {"id": job_id, "team": team, "state": state, "created_at": steps[0][1],
            "manifest": {"learners": learners, "resources": {"gpus": gpus, "cpus": cpus, "memory": memory,
                                                             "gpu_type": gpu_type}},
            "history": [{"to": to, "timestamp": ts} for to, ts in steps]}


def test_a_restart_keeps_the_job_active_and_a_halt_pauses_it():
    j = job("j1", "a", "completed", [("pending", 0), ("queued", 0), ("deploying", 100), ("running", 110),
                                     ("restarting", 200), ("queued", 260), ("deploying", 300), ("running", 310),
                                     ("halting", 400), ("halted", 450), ("queued", 500), ("deploying", 600),
                                     ("running", 610), ("storing", 700), ("completed", 710)], cpus=2)
    # active: 100-260 (restarting is active), 300-450 (halting is active), 600-710
    [row] = usage.rows([j], 0, DAY, now=DAY)
    assert row.cpu_seconds == 2 * (160 + 150 + 110) and row.jobs_active == 1 and row.jobs_submitted == 1


def test_a_running_job_counts_up_to_now_when_until_is_later():
    j = job("j2", "a", "running", [("queued", 0), ("deploying", 1000), ("running", 1001)], gpus=2, gpu_type="h100")
    [row] = usage.rows([j], 0, DAY, now=1500)
    assert row.gpu_seconds_by_type == {"h100": 1000.0} and row.gpu_seconds == 1000
    [row] = usage.rows([j], 0, 1200, now=1500)
    assert row.gpu_seconds == 400


def test_a_window_splits_at_utc_midnight_and_leaves_out_what_is_outside():
    j = job("j3", "a", "completed", [("queued", DAY - 50), ("deploying", DAY - 10), ("running", DAY - 5),
                                     ("storing", DAY + 20), ("completed", DAY + 30)], memory=3 * 2**30)
    rows = usage.rows([j], DAY - 5, DAY + 25, now=10 * DAY)
    assert [(r.day, r.memory_gib_seconds, r.jobs_submitted) for r in rows] == [
        ("1970-01-01", 15.0, 0), ("1970-01-02", 75.0, 0)]


def test_csv_is_rfc4180_with_a_column_per_gpu_type():
    jobs = [job("x", "a", "completed", [("queued", 0), ("deploying", 0), ("completed", 10)], gpus=1, gpu_type="a100"),
            job("y", "b,c", "completed", [("queued", 0), ("deploying", 0), ("completed", 5)], gpus=1)]
    text = usage.to_csv(usage.UsageReport(since=0, until=DAY, group_by="day", days=usage.rows(jobs, 0, DAY, DAY)))
    assert text.startswith("day,team,gpu_seconds,") and text.endswith("\r\n")
    table = list(csv.reader(io.StringIO(text, newline="")))
    assert table[0][-2:] == ["gpu_seconds:a100", "gpu_seconds:unspecified"]
    assert table[2][:3] == ["1970-01-01", "b,c", "5"] and '"b,c"' in text  # quoted where needed


@pytest.mark.parametrize(("since", "until", "group_by", "field"), [
    (None, None, "day", "since"), ("nope", None, "day", "since"), ("100", "50", "day", "until"),
    ("2026-01-01", "2028-01-01", "day", "until"), ("0", None, "hour", "group_by"), ("nan", None, "day", "since"),
    ("inf", None, "day", "since"), ("-5", None, "day", "since"), ("0", "1e300", "day", "until"),
    ("0001-01-01", None, "day", "since")])
def test_bad_windows_name_their_field(since, until, group_by, field):
    with pytest.raises(InvalidArgument) as err:
        usage.window(since, until, group_by, now=2e9)
    assert err.value.details[0]["field"] == field


def test_dates_and_times_parse_as_utc():
    assert usage.window("1970-01-02", "1970-01-03T00:00:00Z", "day", now=0) == (DAY, 2 * DAY)
    assert usage.window("86400", None, "day", now=2 * DAY) == (DAY, 2 * DAY)


def test_an_elastic_jobs_grants_are_charged_from_their_entries_and_split_at_midnight():
    j = job("el", "a", "running", [("pending", 0), ("queued", 0), ("deploying", DAY - 7200), ("running", DAY - 7190)],
            learners={"min": 1, "max": 4}, cpus=2, memory=2**30)
    # two more learners granted an hour before midnight (the entry the Trainer writes: all held beyond min)
    j["history"].append({"to": "running", "timestamp": DAY - 3600, "grown": {"gpus": 0, "cpus": 4.0,
                                                                           "memory": 2 * 2**30}})
    first, second = usage.rows([j], 0, 2 * DAY, now=DAY + 1000)
    assert first.cpu_seconds == 3600 * 2 + 3600 * 6 and first.memory_gib_seconds == 3600 + 3600 * 3
    assert second.cpu_seconds == 1000 * 6 and second.memory_gib_seconds == 1000 * 3
    assert first.borrowed_cpu_seconds == second.borrowed_cpu_seconds == 0
    # without the grant's entry: its minimum all along, as before
    j["history"].pop()
    first, second = usage.rows([j], 0, 2 * DAY, now=DAY + 1000)
    assert (first.cpu_seconds, second.cpu_seconds) == (7200 * 2, 1000 * 2)

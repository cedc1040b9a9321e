"""Usage accounting: what each team's jobs consumed, per UTC day, computed live from status histories.

A job holds its resources while it is in one of the ACTIVE states (the same
rule the Trainer's admission and running totals use): from the history entry
that entered an ACTIVE state to the one that left them. Each such stint is
clipped to the asked window [since, until) and split at UTC midnight; a job
still ACTIVE counts up to `until` (or now, whichever is earlier), so a long
job's figures grow while it runs rather than appear when it ends. Nothing is
precomputed: every figure is the sum over the histories the Trainer hands out
now, so there is no nightly job to miss and nothing to drift.

Figures per (day, team): GPU-seconds (total and by GPU type; a job without a
type counts under `unspecified`), CPU-seconds, memory-GiB-seconds, the jobs
that held resources that day and the jobs submitted that day, and of the GPU-
and CPU-seconds those held on quota borrowed in the team's cohort: the
history entry that reserved a stint's resources says what that stint
borrowed (services/trainer/cohorts.py), so a job that ran on its own quota
once and on borrowed quota after a requeue is counted right for each. An
elastic job holds its minimum from the reserving entry and, from each grant's
entry on (the Trainer writes one per grant, services/trainer/store.py `grant`),
what that entry's `grown` says beyond it, so it is charged what it held over
time; a grant is never borrowed (growth stays within the team's own quota),
and histories without grant entries count as before. `rows` is pure;
`collect` pages every team's jobs out of the Trainer; `to_csv` is RFC 4180.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from trainforge_services.api.trainer_client import TrainerApi
from trainforge_services.common.errors import InvalidArgument

DAY = 86400.0
UNSPECIFIED_GPU = "unspecified"
# The job states (REST names) in which a job holds its resources: trainforge_services.common.states.ACTIVE.
ACTIVE = frozenset({"deploying", "running", "storing", "halting", "restarting"})
# At most this many days in one report: a year and a day, enough for any chart or export.
MAX_DAYS = 366
_PAGE = 500
# 9999-12-31T00:00:00Z: the last day a date can name
_LATEST = 253402214400.0


class UsageDay(BaseModel):
    day: str = Field(description="UTC date, YYYY-MM-DD")
    team: str
    gpu_seconds: float = Field(description="GPU-seconds, every GPU type together")
    gpu_seconds_by_type: dict[str, float] = Field(
        description=f"GPU-seconds per GPU type; jobs that named none count under {UNSPECIFIED_GPU!r}")
    cpu_seconds: float
    memory_gib_seconds: float = Field(description="GiB (2^30 bytes) held, times seconds")
    borrowed_gpu_seconds: float = Field(0.0, description="of gpu_seconds, those held on quota borrowed in the "
                                        "team's cohort")
    borrowed_cpu_seconds: float = Field(0.0, description="of cpu_seconds, those held on borrowed quota")
    jobs_active: int = Field(description="jobs that held resources during the day")
    jobs_submitted: int = Field(description="jobs submitted during the day")


class UsageReport(BaseModel):
    since: float = Field(description="start of the window, unix seconds")
    until: float = Field(description="end of the window (exclusive), unix seconds; now when not given")
    group_by: str = Field(description="always 'day' (UTC)")
    days: list[UsageDay] = Field(description="one row per day and team that had any usage or submission")


@dataclass
class _Tally:
    gpu: dict[str, float] = field(default_factory=dict)
    cpu: float = 0.0
    mem: float = 0.0
    borrowed_gpu: float = 0.0
    borrowed_cpu: float = 0.0
    active: set[str] = field(default_factory=set)
    submitted: int = 0


def _bad(name: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{name}: {message}", details=[{"field": name, "message": message}])


def parse_time(value: str | None, name: str) -> float | None:
    """Unix seconds from unix seconds or ISO-8601 (UTC without an offset; a bare date is its midnight)."""
    if value is None or value == "":
        return None
    try:
        t = float(value)
    except ValueError:
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise _bad(name, f"{value[:40]!r} is not a time; use ISO-8601 (e.g. 2026-11-01 or "
                             "2026-11-01T12:00:00Z) or unix seconds") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        t = parsed.timestamp()
    if not (math.isfinite(t) and 0 <= t <= _LATEST):
        raise _bad(name, "must be a time between 1970-01-01 and 9999-12-31")
    return t


def window(since: str | None, until: str | None, group_by: str, now: float) -> tuple[float, float]:
    """The validated [since, until) window; InvalidArgument names the field at fault."""
    if group_by != "day":
        raise _bad("group_by", f"{group_by[:20]!r} is not supported; use 'day'")
    start = parse_time(since, "since")
    if start is None:
        raise _bad("since", "required, e.g. since=2026-11-01")
    end = parse_time(until, "until")
    end = now if end is None else end
    if end <= start:
        raise _bad("until", "must be after since")
    if (end - start) / DAY > MAX_DAYS:
        raise _bad("until", f"the window may span at most {MAX_DAYS} days")
    return start, end


def _day_start(t: float) -> float:
    return (t // DAY) * DAY


def day_name(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d")


def stints(job: dict, until: float) -> Iterator[tuple[float, float, dict, dict]]:
    """The [start, end) spans in which the job held the same resources, from its history, each with what it
    borrowed and what it held beyond its minimum ({gpus, cpus, memory}; empty: nothing). A stint starts at
    the entry that entered the ACTIVE states and ends at the one that left them; a grant's entry (one with
    `grown`) splits it, the part after holding the grant too. A job still holding them has an open span,
    which ends at `until`."""
    started: float | None = None
    borrowed: dict = {}
    grown: dict = {}
    for event in sorted(job.get("history") or (), key=lambda e: e["timestamp"]):
        ts = float(event["timestamp"])
        if event["to"] in ACTIVE:
            if started is None:
                started, borrowed, grown = ts, event.get("borrowed") or {}, {}
            elif event.get("grown") is not None:
                yield started, ts, borrowed, grown
                started, grown = ts, event["grown"]
        elif started is not None:
            yield started, ts, borrowed, grown
            started = None
    if started is not None and job.get("state") in ACTIVE:
        yield started, until, borrowed, grown


def _demand(job: dict) -> tuple[str, float, float, float]:
    """(gpu type, GPUs, CPUs, GiB) of all the job's learners together, from its validated manifest."""
    manifest = job.get("manifest") or {}
    resources = manifest.get("resources") or {}
    learners = manifest.get("learners", 1)
    # an elastic job ({min, max}) holds its minimum; what it was granted beyond is in its history (`stints`)
    n = int(learners["min"] if isinstance(learners, dict) else learners)
    gpu_type = resources.get("gpu_type") or UNSPECIFIED_GPU
    return (gpu_type, float(resources.get("gpus", 0)) * n, float(resources.get("cpus", 1.0)) * n,
            float(resources.get("memory", 2 * 2**30)) * n / 2**30)


def rows(jobs: Iterable[dict], since: float, until: float, now: float) -> list[UsageDay]:
    """Per (day, team) figures of the jobs in [since, until), sorted by day then team; a job still
    running counts up to now when the window reaches past it."""
    open_end = min(until, now)
    tallies: dict[tuple[float, str], _Tally] = {}
    for job in jobs:
        team = job["team"]
        created = float(job.get("created_at") or 0.0)
        if since <= created < until:
            tallies.setdefault((_day_start(created), team), _Tally()).submitted += 1
        gpu_type, gpus, cpus, gib = _demand(job)
        for start, end, borrowed, grown in stints(job, open_end):
            start, end = max(start, since), min(end, until)
            held_gpus = gpus + float(grown.get("gpus", 0))
            held_cpus = cpus + float(grown.get("cpus", 0.0))
            held_gib = gib + float(grown.get("memory", 0)) / 2**30
            while start < end:
                day = _day_start(start)
                piece_end = min(end, day + DAY)
                seconds = piece_end - start
                tally = tallies.setdefault((day, team), _Tally())
                if held_gpus:
                    tally.gpu[gpu_type] = tally.gpu.get(gpu_type, 0.0) + seconds * held_gpus
                tally.cpu += seconds * held_cpus
                tally.mem += seconds * held_gib
                tally.borrowed_gpu += seconds * float(borrowed.get("gpus", 0))
                tally.borrowed_cpu += seconds * float(borrowed.get("cpus", 0.0))
                tally.active.add(job["id"])
                start = piece_end
    return [UsageDay(day=day_name(day), team=team, gpu_seconds=round(sum(t.gpu.values()), 3),
                     gpu_seconds_by_type={k: round(v, 3) for k, v in sorted(t.gpu.items())},
                     cpu_seconds=round(t.cpu, 3), memory_gib_seconds=round(t.mem, 3),
                     borrowed_gpu_seconds=round(t.borrowed_gpu, 3), borrowed_cpu_seconds=round(t.borrowed_cpu, 3),
                     jobs_active=len(t.active),
                     jobs_submitted=t.submitted)
            for (day, team), t in sorted(tallies.items())]


def team_jobs(trainer: TrainerApi, team: str, until: float) -> Iterator[dict]:
    """Every job of the team created before `until`, newest first, page by page."""
    before: tuple[float, str] | None = None
    while True:
        page = trainer.list_jobs(team, limit=_PAGE, created_before=until, before=before)
        yield from page
        if len(page) < _PAGE:
            return
        before = (page[-1]["created_at"], page[-1]["id"])


def collect(trainer: TrainerApi, teams: Iterable[str], since: float, until: float, now: float) -> UsageReport:
    jobs = (job for team in teams for job in team_jobs(trainer, team, until))
    return UsageReport(since=since, until=until, group_by="day", days=rows(jobs, since, until, now))


CSV_COLUMNS = ("day", "team", "gpu_seconds", "cpu_seconds", "memory_gib_seconds", "jobs_active", "jobs_submitted",
               "borrowed_gpu_seconds", "borrowed_cpu_seconds")


def to_csv(report: UsageReport) -> str:
    """RFC 4180: a header row, CRLF line ends, quoted where needed; one `gpu_seconds:<type>` column per type."""
    gpu_types = sorted({t for d in report.days for t in d.gpu_seconds_by_type})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow([*CSV_COLUMNS, *(f"gpu_seconds:{t}" for t in gpu_types)])
    for d in report.days:
        writer.writerow([d.day, d.team, _num(d.gpu_seconds), _num(d.cpu_seconds), _num(d.memory_gib_seconds),
                         d.jobs_active, d.jobs_submitted, _num(d.borrowed_gpu_seconds),
                         _num(d.borrowed_cpu_seconds), *(_num(d.gpu_seconds_by_type.get(t, 0.0))
                                                            for t in gpu_types)])
    return out.getvalue()


def _num(x: float) -> str:
    """Integers without a trailing .0 (spreadsheets read both; people read this one better)."""
    return str(int(x)) if float(x).is_integer() else repr(round(x, 3))

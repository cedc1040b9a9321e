"""The `trainforge` command's exit statuses, one table for people and scripts (README, "Exit codes").

A command that follows a job to its end (`submit --follow`, `logs -f`)
exits with the job's outcome, so a CI step fails when the job did; every
other command exits 0 when it did what was asked.
"""

from __future__ import annotations

OK = 0  # done; a followed job completed
ERROR = 1  # the API refused the request or could not be reached, or the input was bad (one line on stderr)
USAGE = 2  # an unknown command, option or a missing argument (click's own)
JOB_FAILED = 3  # a followed job ended failed
JOB_CANCELLED = 4  # a followed job was cancelled
JOB_HALTED = 5  # a followed job was halted before it completed (resume it to go on)
INTERRUPTED = 130  # Ctrl-C while following; the job itself goes on

_BY_STATE = {"completed": OK, "failed": JOB_FAILED, "cancelled": JOB_CANCELLED, "halted": JOB_HALTED}


def for_state(state: str) -> int:
    """The exit status of a command that followed a job until it came to rest in `state`."""
    return _BY_STATE.get(state, ERROR)


TABLE = (
    (OK, "success; a followed job completed"),
    (ERROR, "the API refused the request or could not be reached, or bad input (one line on stderr)"),
    (USAGE, "unknown command or option, missing argument"),
    (JOB_FAILED, "`submit --follow` / `logs -f`: the job failed"),
    (JOB_CANCELLED, "`submit --follow` / `logs -f`: the job was cancelled"),
    (JOB_HALTED, "`submit --follow` / `logs -f`: the job was halted"),
    (INTERRUPTED, "interrupted (Ctrl-C) while following; the job goes on"),
)

"""How a learner's run ended, and the small helpers every part of the run uses to say so.

`Outcome` is what the run phase (services/controller/controller.py) and a halt
(services/controller/halt.py) return; the controller turns it into the final
`LearnerStatus` once the log tail is known. `system_line` writes the
controller's own lines into the log archive, `text` turns an error into the
short sentence those lines and the status messages carry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from trainforge_services.common.contracts.etcd import LearnerStatus
from trainforge_services.common.errors import message_of
from trainforge_services.common.states import LearnerState

from .logship import LogArchive

log = logging.getLogger(__name__)

# How long the end of a run may wait for etcd (the log store's wait is a setting, log_drain_seconds).
FINAL_STATUS_SECONDS = 30.0


@dataclass
class Outcome:
    """How the run ended; the final `LearnerStatus` is made from it once the log tail is known."""

    state: LearnerState
    exit_code: int | None = None
    message: str = ""
    outputs_uri: str = ""
    tail: list[str] = field(default_factory=list)
    step: int | None = None
    checkpoint_uri: str = ""
    lines_archived: int | None = None
    lines_shipped: int | None = None
    timed_out: bool = False

    def status(self, attempt: int, isolation: str = "") -> LearnerStatus:
        return LearnerStatus(state=self.state, attempt=attempt, exit_code=self.exit_code, message=self.message,
                             tail=self.tail, outputs_uri=self.outputs_uri, step=self.step,
                             checkpoint_uri=self.checkpoint_uri, isolation=isolation,
                             lines_archived=self.lines_archived, lines_shipped=self.lines_shipped,
                             timed_out=self.timed_out)


def system_line(archive: LogArchive, message: str) -> None:
    """A line of the controller's own in the learner's log; a full disk must not end the run."""
    try:
        archive.append("system", message)
    except (OSError, ValueError) as e:
        log.warning("could not archive the line %r: %s", message, e)


def text(e: BaseException) -> str:
    """`message_of(e)`, but an OSError by its reason and file, without the errno."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return message_of(e)

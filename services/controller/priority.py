"""The CPU priority of the controller's background threads: the learner comes first.

The threads that turn the learner's output into archive lines and ship them
(services/controller/spool.py, logship.py) run at nice 19: where they
compete with the learner for a CPU the learner wins (CFS weight 1024 against
15), and on an idle core they run at full speed. Lines are never dropped for
it, only indexed later. Linux keeps nice values per thread, so this touches
neither the learner nor the controller's own status and halt threads.
"""

from __future__ import annotations

import contextlib
import os
import threading

BACKGROUND_NICE = 19


def background_priority() -> None:
    """Lower the calling thread's CPU priority to BACKGROUND_NICE (a no-op where the OS refuses)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)

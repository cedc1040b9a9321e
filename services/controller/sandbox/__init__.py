"""The learner sandbox on the local backend (issue 15; docs/THREAT_MODEL.md).

policy.py   which isolation a learner gets (TF_ISOLATION, TF_REQUIRE_ISOLATION, what the kernel allows)
box.py      one learner's sandbox from the controller's side: set up, wrap the command, OOM, clean up
view.py     the filesystem view and the job's uid, as the config the entry reads
netns.py    the job's private network namespace (loopback only)
cgroups.py  the learner's cgroup v1 limits (memory, cpu quota, pids)
enter.py    the entry the controller runs in place of the guard (it keeps the guard's promise): namespaces, mounts, chroot, drop to the job's uid
userns.py   without root: the job's user + network namespace holder, and egress listeners bound inside it
"""

from .box import Sandbox
from .policy import Chosen, Decision, choose, container_egress, decide

__all__ = ["Chosen", "Decision", "Sandbox", "choose", "container_egress", "decide"]

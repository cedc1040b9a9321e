"""One learner's sandbox, from the controller's side: set up, wrap the command, report, clean up.

`prepare()` runs after the working directory is filled: it joins or makes
the job's network namespace, creates the learner's cgroups with the
manifest's limits, hands the working directory to the job's uid and
writes the config the entry reads, then starts the egress forwarders the
job's policy allows (egress.py) and writes the hosts file that names them.
`argv()` is the learner's shell under
the entry (services/controller/sandbox/enter.py), which the controller
starts in place of the guard: the entry leads the learner's group and
watches the guard's lifeline itself, so the guard's group-kill semantics
hold for everything inside. `oom_message()` names the memory limit when the kernel
killed the learner for it; `cleanup()` removes the cgroups (the job's
namespace outlives one learner and is removed by the local backend's stop).

`unprivileged` (the platform is not root: `isolation: userns`): the job's
namespaces are a holder process's (userns.py) instead of `ip netns`, there
are no cgroups (the controller's memory watchdog stays the limit), the
working directory stays the platform's (it is the learner's uid outside)
and the egress listeners are made by a helper inside the namespace.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.egress import Policy
from trainforge_services.common.isolation import netns_name

from ..learner import human_bytes
from . import netns, userns, view
from .cgroups import LearnerCgroups, Limits
from .egress import Egress, hosts_file

log = logging.getLogger(__name__)

ENTER = Path(__file__).with_name("enter.py")


class Sandbox:
    def __init__(self, spec: LearnerSpec, state_dir: Path, *, python: str = sys.executable,
                 egress: Policy = Policy(), store_endpoint: str = "", unprivileged: bool = False):
        self.spec, self.python, self.unprivileged = spec, python, unprivileged
        self.state_dir = Path(state_dir).resolve()
        self.uid = 0 if unprivileged else view.job_uid(spec.job_id)
        self.cgroups = LearnerCgroups(spec.job_id, spec.rank, spec.attempt)
        self.config_path = spec.workdir.parent / f".sandbox-{spec.rank}-{spec.attempt}.json"
        self.hosts_path = spec.workdir.parent / f".sandbox-hosts-{spec.rank}-{spec.attempt}"
        # userns: the holder's pid file, in the job's folder (gone with it), and an empty folder to build on
        self.holder_file = spec.workdir.parent.parent / ".userns-holder"
        self.stage = spec.workdir.parent / f".sandbox-root-{spec.rank}-{spec.attempt}"
        self.holder = 0
        self.egress = Egress(egress, netns_name(spec.job_id), netns.path_of(spec.job_id), store_endpoint,
                             listen=self._listen if unprivileged else None)

    @property
    def limits_memory(self) -> bool:
        """Whether a cgroup enforces the memory limit (else the controller's watchdog does)."""
        return not self.unprivileged

    def _listen(self, addresses: list[tuple[str, int]]) -> list:
        return userns.listen_in(self.holder, addresses, python=sys.executable)

    def _namespaces(self) -> dict:
        """The entry's config entries for the job's namespaces (and cgroups), made or joined."""
        spec = self.spec
        if self.unprivileged:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TF_JOB_ID": spec.job_id,
                   "TF_WORKDIR": str(self.holder_file.parent)}  # the local backend's stop finds it by these
            self.holder = userns.ensure(self.holder_file, env, python=sys.executable)
            self.stage.mkdir(mode=0o700, exist_ok=True)
            return {"netns": None, "cgroup_procs": [], "holder": self.holder, "stage": self.stage}
        ns = netns.ensure(spec.job_id)
        res = spec.manifest.resources
        self.cgroups.create(Limits(memory=res.memory, cpus=res.cpus, pids=res.pids))
        view.hand_over(spec.workdir, self.uid)
        return {"netns": ns, "cgroup_procs": self.cgroups.procs_files}

    def prepare(self) -> None:
        """Everything the entry needs; OSError naming what the kernel refused."""
        spec = self.spec
        namespaces = self._namespaces()
        self.hosts_path.write_text(hosts_file(self.egress.names))
        os.chmod(self.hosts_path, 0o644)
        cfg = view.config(workdir=spec.workdir.resolve(), secrets=[self.state_dir, Path.home().resolve()],
                          python=self.python, uid=self.uid, hosts=self.hosts_path, **namespaces)
        view.write_config(self.config_path, cfg)
        self.egress.start()
        for note in self.egress.notes:
            log.info("%s", note)

    def argv(self, command: str, lifeline: int | None = None, hold: int | None = None, *,
             pass_hold: bool = False) -> list[str]:
        """The learner's shell under the entry; with `lifeline` (the guard's pipe end) the entry leads the
        group and watches it itself, so no guard runs (enter.py); with `hold`, the entry's pid 1 waits for a
        byte on that pipe end before it starts the shell (a held learner), or with `pass_hold` starts it at
        once and hands the pipe on to the command, a Python interpreter that holds itself (pyhold.py)."""
        watch = ["--lifeline", str(lifeline)] if lifeline is not None else []
        if hold is not None:
            watch += ["--pass-hold" if pass_hold else "--hold", str(hold)]
        return [self.python, "-I", "-S", str(ENTER), *watch, str(self.config_path), "/bin/sh", "-c", command]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """The learner's environment inside: a home it can write, rendezvous over the namespace's loopback, what
        its egress policy allows (TF_EGRESS; AWS_ENDPOINT_URL for `store`)."""
        out = dict(env)
        out.update(self.egress.env())
        out.update({"HOME": "/tmp", "TMPDIR": "/tmp", "USER": "learner", "LOGNAME": "learner"})
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            out.setdefault(var, "lo")
        return out

    def oom_message(self) -> str:
        """'' unless the kernel's OOM killer fired in the learner's memory cgroup."""
        if self.unprivileged or not self.cgroups.oom_killed():
            return ""
        return (f"memory limit exceeded: out of memory (OOM kill) in the learner's cgroup, "
                f"limit {human_bytes(self.spec.manifest.resources.memory)}")

    def cleanup(self) -> None:
        self.egress.stop()
        self.config_path.unlink(missing_ok=True)
        self.hosts_path.unlink(missing_ok=True)
        if self.unprivileged:
            try:
                self.stage.rmdir()
            except OSError:
                pass
            return
        if not self.cgroups.remove():
            log.warning("the learner's cgroups could not all be removed; the local backend's stop retries")

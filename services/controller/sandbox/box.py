"""One learner's sandbox, from the controller's side: set up, wrap the command, report, clean up.

`prepare()` runs after the working directory is filled: it joins or makes
the job's network namespace, creates the learner's cgroups with the
manifest's limits, hands the working directory to the job's uid and
writes the config the entry reads, then starts the egress forwarders the
job's policy allows (egress.py) and writes the hosts file that names them.
`argv()` is the learner's shell under
the entry (services/controller/sandbox/enter.py), which the guard starts
in place of the bare shell, so the guard's group-kill semantics hold for
everything inside. `oom_message()` names the memory limit when the kernel
killed the learner for it; `cleanup()` removes the cgroups (the job's
namespace outlives one learner and is removed by the local backend's stop).
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
from . import netns, view
from .cgroups import LearnerCgroups, Limits
from .egress import Egress, hosts_file

log = logging.getLogger(__name__)

ENTER = Path(__file__).with_name("enter.py")


class Sandbox:
    def __init__(self, spec: LearnerSpec, state_dir: Path, *, python: str = sys.executable,
                 egress: Policy = Policy(), store_endpoint: str = ""):
        self.spec, self.python = spec, python
        self.state_dir = Path(state_dir).resolve()
        self.uid = view.job_uid(spec.job_id)
        self.cgroups = LearnerCgroups(spec.job_id, spec.rank, spec.attempt)
        self.config_path = spec.workdir.parent / f".sandbox-{spec.rank}-{spec.attempt}.json"
        self.hosts_path = spec.workdir.parent / f".sandbox-hosts-{spec.rank}-{spec.attempt}"
        self.egress = Egress(egress, netns_name(spec.job_id), netns.path_of(spec.job_id), store_endpoint)

    def prepare(self) -> None:
        """Everything the entry needs; OSError naming what the kernel refused."""
        spec = self.spec
        ns = netns.ensure(spec.job_id)
        res = spec.manifest.resources
        self.cgroups.create(Limits(memory=res.memory, cpus=res.cpus, pids=res.pids))
        view.hand_over(spec.workdir, self.uid)
        self.hosts_path.write_text(hosts_file(self.egress.names))
        os.chmod(self.hosts_path, 0o644)
        cfg = view.config(workdir=spec.workdir.resolve(), secrets=[self.state_dir, Path.home().resolve()],
                          python=self.python, netns=ns, cgroup_procs=self.cgroups.procs_files, uid=self.uid,
                          hosts=self.hosts_path)
        view.write_config(self.config_path, cfg)
        self.egress.start()
        for note in self.egress.notes:
            log.info("%s", note)

    def argv(self, command: str) -> list[str]:
        return [self.python, "-I", "-S", str(ENTER), str(self.config_path), "/bin/sh", "-c", command]

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
        if not self.cgroups.oom_killed():
            return ""
        return (f"memory limit exceeded: out of memory (OOM kill) in the learner's cgroup, "
                f"limit {human_bytes(self.spec.manifest.resources.memory)}")

    def cleanup(self) -> None:
        self.egress.stop()
        self.config_path.unlink(missing_ok=True)
        self.hosts_path.unlink(missing_ok=True)
        if not self.cgroups.remove():
            log.warning("the learner's cgroups could not all be removed; the local backend's stop retries")

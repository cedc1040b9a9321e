"""The etcd key layout (docs/CONTRACTS.md), in one place.

    <prefix>/jobs/<job>/attempt                 {"attempt": n, "checkpoint_uri": ...}
    <prefix>/jobs/<job>/learners/<rank>/status  LearnerStatusDoc, under the controller's lease
    <prefix>/jobs/<job>/halt                    {"attempt": n, "requested_at": ts}
    <prefix>/jobs/<job>/gate                    {"attempt": n, "opened_at": ts}: a gated job's learners may start
    <prefix>/jobs/<job>/learners/<rank>/halted  {"attempt": n, "checkpoint_uri": ..., "step": n}
    <prefix>/jobs/<job>/learners/<rank>/checkpoint {"attempt": n, "step": n, "uri": ...}
    <prefix>/jobs/<job>/monitor                 {"pid": ..., "host": ...}, under the monitor's lease
    <prefix>/leaders/<service>                  {"holder": ..., "address": ...}, under the leader's lease
    <prefix>/lcm/killed/<job>                   {"attempt": n, "killed_at": ts}, under a lease of
                                                TF_KILLED_TTL s: the highest attempt the LCM removed
                                                (outside jobs/<job>/: it outlives the job's keys)
    <prefix>/jobs/<job>/logship/<rank>          {"attempt": n, "archived": n, "shipped": n}, under the
                                                controller's status lease (outside learners/: the monitor
                                                does not watch it)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "/trainforge"

    def leader(self, service: str) -> str:
        return f"{self.prefix}/leaders/{service}"

    def killed(self, job: str) -> str:
        return f"{self.prefix}/lcm/killed/{job}"

    def job(self, job: str) -> str:
        return f"{self.prefix}/jobs/{job}/"

    def attempt(self, job: str) -> str:
        return f"{self.prefix}/jobs/{job}/attempt"

    def learners(self, job: str) -> str:
        return f"{self.prefix}/jobs/{job}/learners/"

    def learner_status(self, job: str, rank: int) -> str:
        return f"{self.prefix}/jobs/{job}/learners/{rank}/status"

    def learner_halted(self, job: str, rank: int) -> str:
        return f"{self.prefix}/jobs/{job}/learners/{rank}/halted"

    def learner_checkpoint(self, job: str, rank: int) -> str:
        return f"{self.prefix}/jobs/{job}/learners/{rank}/checkpoint"

    def halt(self, job: str) -> str:
        return f"{self.prefix}/jobs/{job}/halt"

    def gate(self, job: str) -> str:
        return f"{self.prefix}/jobs/{job}/gate"

    def monitor(self, job: str) -> str:
        return f"{self.prefix}/jobs/{job}/monitor"

    def logships(self, job: str) -> str:
        return f"{self.prefix}/jobs/{job}/logship/"

    def logship(self, job: str, rank: int) -> str:
        return f"{self.prefix}/jobs/{job}/logship/{rank}"

    def parse_learner_key(self, job: str, key: str) -> tuple[int, str] | None:
        """'<prefix>/jobs/j/learners/3/status' -> (3, 'status'); None for other keys."""
        base = self.learners(job)
        if not key.startswith(base):
            return None
        parts = key[len(base):].split("/")
        if len(parts) != 2 or not parts[0].isdigit():
            return None
        return int(parts[0]), parts[1]


# Files in an attempt's directory (local backend), shared by the LCM and the job monitor.
MONITOR_DONE = "monitor.done"  # the monitor delivered the attempt's last state; it needs no restart

"""`python -m trainforge_services.lcm.backends.kubernetes.entry learner|monitor`: the entrypoint injected into every pod.

It turns what the pod was given into what the controller and the job
monitor read on every backend: the spec JSON from `TF_SPEC` (plus, for a
learner, each team secret from its `TF_SECRET__<VAR>` variable, which a
Secret fills) becomes a spec file (0600) in the pod's working directory.

- learner: exec `python -m trainforge_services.controller --spec <file>`. The
  controller then starts the learner's command as its own child, exactly as
  on the local backend (docs/KUBERNETES.md: why not a sidecar). The spec's
  and the secrets' variables are taken out of the environment first.
- monitor: run `python -m trainforge_services.jobmonitor --spec <attempt dir>/monitor.json`
  and exit 0 only when it left its `monitor.done` marker: the pod's phase
  Succeeded is how the LCM reads "the monitor delivered the last state".

Runs inside the pod, so it imports only the spec models.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from trainforge_services.common.contracts.specs import LearnerSpec, MonitorSpec
from trainforge_services.common.errors import TrainforgeError
from trainforge_services.common.keys import MONITOR_DONE

SPEC_ENV = "TF_SPEC"
SECRET_PREFIX = "TF_SECRET__"
ATTEMPT_DIR_ENV = "TF_ATTEMPT_DIR"
EXIT_USAGE = 2
# the monitor ended without delivering the attempt's last state (stopped, or another monitor holds the job)
EXIT_UNFINISHED = 3


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def learner(env: dict[str, str]) -> int:
    spec = LearnerSpec.parse(env.get(SPEC_ENV, ""), SPEC_ENV)
    secrets = {var: env[f"{SECRET_PREFIX}{var}"] for var in spec.manifest.secret_env()
               if f"{SECRET_PREFIX}{var}" in env}
    spec = spec.model_copy(update={"secret_env": secrets})
    path = spec.workdir.parent / f"learner-{spec.rank}.json"
    _write(path, spec.to_json())
    clean = {k: v for k, v in env.items() if k != SPEC_ENV and not k.startswith(SECRET_PREFIX)}
    os.execve(sys.executable, [sys.executable, "-m", "trainforge_services.controller", "--spec", str(path)], clean)
    return EXIT_USAGE  # not reached


def monitor(env: dict[str, str]) -> int:
    spec = MonitorSpec.parse(env.get(SPEC_ENV, ""), SPEC_ENV)
    attempt_dir = Path(env.get(ATTEMPT_DIR_ENV) or "/tmp/trainforge")  # noqa: S108 - an emptyDir in the pod
    path = attempt_dir / "monitor.json"
    _write(path, spec.to_json())
    (attempt_dir / MONITOR_DONE).unlink(missing_ok=True)
    clean = {k: v for k, v in env.items() if k != SPEC_ENV}
    proc = subprocess.Popen([sys.executable, "-m", "trainforge_services.jobmonitor", "--spec", str(path)], env=clean)  # noqa: S603
    # a deleted pod's SIGTERM reaches this process (pid 1 in its container): the monitor handles it
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    rc = proc.wait()
    if (attempt_dir / MONITOR_DONE).exists():
        return 0
    return rc or EXIT_UNFINISHED


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["learner"], ["monitor"]):
        print("usage: python -m trainforge_services.lcm.backends.kubernetes.entry learner|monitor", file=sys.stderr)
        return EXIT_USAGE
    try:
        return learner(dict(os.environ)) if args[0] == "learner" else monitor(dict(os.environ))
    except TrainforgeError as e:
        print(f"trainforge entrypoint: {e.message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

"""`python -m trainforge_services.lcm.backends.kubernetes.entry learner|monitor`: the entrypoint injected into every pod.

It turns what the pod was given into what the controller and the job
monitor read on every backend: the spec JSON from `TF_SPEC` (plus, for a
learner, each team secret from its `TF_SECRET__<VAR>` variable, which a
Secret fills) becomes a spec file (0600) in the pod's working directory.

- learner (the learner pod's `controller` container): run
  `python -m trainforge_services.controller --spec <file>`. The spec's
  launcher is the hand-off (services/controller/handoff.py), which has
  the learner container's waiter (frameworks/podwaiter.py) run the command in the
  hand-off directory `TF_HANDOFF_DIR` (an emptyDir both containers mount); when the
  controller exits, its end marker there tells a waiter still waiting for
  its go to exit too. Files are made under umask 027 and the attempt
  directory is 0750: the learner's uid, in the pod's group, writes only in
  its working directory (the hand-off shares that tree). The spec's and the
  secrets' variables are taken out of the environment first.
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

from trainforge_frameworks.podwaiter import CONTROLLER_END
from trainforge_services.common.contracts.specs import LearnerSpec, MonitorSpec
from trainforge_services.common.errors import InvalidArgument, TrainforgeError
from trainforge_services.common.keys import MONITOR_DONE

SPEC_ENV = "TF_SPEC"
SECRET_PREFIX = "TF_SECRET__"
ATTEMPT_DIR_ENV = "TF_ATTEMPT_DIR"
HANDOFF_ENV = "TF_HANDOFF_DIR"
HANDOFF_MODULE = "trainforge_services.controller.handoff"
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
    handoff = env.get(HANDOFF_ENV, "")
    if not handoff:
        raise InvalidArgument(f"{HANDOFF_ENV} is not set: the learner pod's hand-off directory",
                              details=[{"field": HANDOFF_ENV, "message": "missing"}])
    # the guard starts the launcher with posix_spawn, which needs the interpreter's own path
    spec = spec.model_copy(update={"launcher": [sys.executable, "-m", HANDOFF_MODULE, "--reason",
                                                str(spec.exit_reason_path), handoff]})
    os.umask(0o027)
    spec.workdir.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(spec.workdir.parent, 0o750)
    path = spec.workdir.parent / f"learner-{spec.rank}.json"
    _write(path, spec.to_json())
    clean = {k: v for k, v in env.items() if k != SPEC_ENV and not k.startswith(SECRET_PREFIX)}
    try:
        return _child([sys.executable, "-m", "trainforge_services.controller", "--spec", str(path)], clean)
    finally:
        Path(handoff, CONTROLLER_END).write_text("")


def _child(argv: list[str], env: dict[str, str]) -> int:
    """Run argv, passing on SIGTERM and SIGINT (a deleted pod's SIGTERM reaches pid 1 of the container)."""
    proc = subprocess.Popen(argv, env=env)  # noqa: S603
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    rc = proc.wait()
    return 128 - rc if rc < 0 else rc  # killed by signal N: 128+N, as a shell says


def monitor(env: dict[str, str]) -> int:
    spec = MonitorSpec.parse(env.get(SPEC_ENV, ""), SPEC_ENV)
    attempt_dir = Path(env.get(ATTEMPT_DIR_ENV) or "/tmp/trainforge")  # noqa: S108 - an emptyDir in the pod
    path = attempt_dir / "monitor.json"
    _write(path, spec.to_json())
    (attempt_dir / MONITOR_DONE).unlink(missing_ok=True)
    clean = {k: v for k, v in env.items() if k != SPEC_ENV}
    rc = _child([sys.executable, "-m", "trainforge_services.jobmonitor", "--spec", str(path)], clean)
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

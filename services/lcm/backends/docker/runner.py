"""The learner's command in a container: what a docker-backend controller runs in place of `/bin/sh -c command`.

The controller keeps its whole contract (status under a lease, the halt
protocol, checkpoints, log shipping, outputs) because, to it, this runner
*is* the learner: it is started under the controller's guard as
`python runner.py <container plan> /bin/sh -c <command>` with the learner's
environment, and it

- starts the container the plan describes (image, limits, labels, static
  address on the attempt's network) with that command and environment;
- copies the container's stdout and stderr to its own, which the controller
  archives and ships;
- forwards SIGTERM and SIGINT to the container, where the engine's init
  (tini, with TINI_KILL_PROCESS_GROUP) hands them to the whole command;
- exits with the container's exit code, after writing a reason a user
  understands (OOM-killed at the memory limit, the engine lost, the image
  missing) to the plan's `reason_path` for the controller's final status;
- removes the container.

Its network: the attempt's internal bridge has no address on the host
(docker_engine.create_network), which the runner checks before the start, so
a container reaches its job's other ranks and nothing else. What the job's
egress policy allows (TF_EGRESS in the environment the controller gives it:
the admin's narrowed by the team's) it relays itself, as the local sandbox
does (trainforge_services.common.relay): after the start it opens a listening
socket per destination inside the container's network namespace (found by
its pid from the engine) and relays from the host's side; host names go
into the container's hosts file. A gated command (`egress_gate`) waits on a
FIFO in its workdir until the relays listen; relays that cannot be set up
refuse the learner.

The learner's workdir is the same path in the container, so checkpoints the
learner writes are where the controller looks for them.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
import threading
from pathlib import Path

# Started by path with the platform's interpreter, which imports the platform's packages from its installation.
from trainforge_services.common.adapters.docker_engine import ContainerRequest, Engine
from trainforge_services.common.egress import parse
from trainforge_services.common.errors import TrainforgeError, Unavailable
from trainforge_services.common.relay import EgressError, Relays, listen_in
from trainforge_services.common.retry import PATIENT
from trainforge_services.lcm.backends.docker.containers import ContainerPlan, build_skeletons

EXIT_CANNOT_START = 125  # docker run's own code for "the container could not be started"
GATE = ".tf-egress-gate"  # the FIFO in the workdir a gated command waits on until the relays listen


def host_addresses() -> set[str]:
    """The IPv4 addresses of this host's interfaces (its local routes, as the kernel lists them)."""
    found, last = set(), ""
    for line in Path("/proc/net/fib_trie").read_text().splitlines():
        item = line.strip()
        if item.startswith("|-- "):
            last = item[4:]
        elif item == "/32 host LOCAL":
            found.add(last)
    return found


def egress_gate(command: list[str], fifo: str) -> list[str]:
    """The command behind a wait for one line on `fifo`, which the runner writes once the relays listen."""
    return ["/bin/sh", "-c", 'read -r _ < "$0" && exec "$@"', fifo, *command]


def human_bytes(n: int) -> str:
    for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def container_env(plan: ContainerPlan, image_env: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    """The learner's environment in the container: ours, on PYTHONPATH the platform's code, then the job's own
    entries (the manifest's PYTHONPATH; a host folder the image lacks is skipped by Python), then the image's."""
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(
        p for p in (plan.pythonpath, env.get("PYTHONPATH", ""), image_env.get("PYTHONPATH", "")) if p)
    out["PATH"] = os.pathsep.join(p for p in (env.get("PATH", ""), image_env.get("PATH", "")) if p)
    if "PET_RDZV_ENDPOINT" in env:
        # an elastic job's torchrun agent names itself by this address (the worker group's MASTER_ADDR when
        # it leads); the container's hostname resolves nowhere else on an internal network without DNS
        out["PET_LOCAL_ADDR"] = plan.ip
    # tini (the engine's init) hands a signal to the command's whole process group, not just the shell
    out["TINI_KILL_PROCESS_GROUP"] = "1"
    out.update({"HOME": "/tmp", "USER": "learner", "LOGNAME": "learner"})  # the job's uid has no home in the image
    return out


def container_user(plan: ContainerPlan, workdir: Path, *, euid: int | None = None) -> str:
    """The `uid:gid` the container runs as, its /root skeleton made. As root, the job's uid, with the workdir's tree
    handed to it (never following a link); a platform that is not root runs the learner as its own uid, which
    owns the workdir."""
    euid = os.geteuid() if euid is None else euid
    build_skeletons(plan)
    if euid != 0:
        return f"{euid}:{os.getegid()}"
    uid = plan.uid
    os.chown(workdir, uid, uid)
    for top, dirs, files in os.walk(workdir):
        for name in dirs + files:
            os.chown(os.path.join(top, name), uid, uid, follow_symlinks=False)
    return f"{uid}:{uid}"


def _pump(stream, out) -> None:
    try:
        for chunk in stream:
            out.write(chunk)
            out.flush()
    except Exception as e:  # noqa: BLE001 - the engine went away mid-stream; wait() reports it
        print(f"[runner] the container's output stopped: {e}", file=sys.stderr, flush=True)


class Runner:
    def __init__(self, plan: ContainerPlan, command: list[str], env: dict[str, str]):
        self.plan, self.command, self.env = plan, command, env
        self.engine = Engine(plan.engine_url, timeout=30)
        self.cid = ""
        self._signalled: set[int] = set()
        self.relays: Relays | None = None
        self._gate = -1

    def _forward(self, signum: int, _frame) -> None:
        if self.cid and signum not in self._signalled:
            self._signalled.add(signum)
            self.engine.signal(self.cid, signal.Signals(signum).name)

    def reason(self, text: str) -> None:
        print(f"[runner] {text}", file=sys.stderr, flush=True)
        try:
            Path(self.plan.reason_path).write_text(text + "\n")
        except OSError as e:
            print(f"[runner] cannot write {self.plan.reason_path}: {e}", file=sys.stderr, flush=True)

    def start(self) -> None:
        p = self.plan
        subnet = ipaddress.ip_network(f"{p.ip}/24", strict=False)
        held = sorted(a for a in host_addresses() if ipaddress.ip_address(a) in subnet)
        if held:
            raise EgressError(f"this host has {', '.join(held)} on the attempt's network {subnet} (the engine gave "
                              f"its bridge an address), where the learner could reach the host's services")
        try:
            policy = parse(self.env.get("TF_EGRESS", "none"), "TF_EGRESS")
        except ValueError as e:
            raise EgressError(str(e)) from None
        relays = self.relays = Relays(policy, self.env.get("AWS_ENDPOINT_URL", ""), self._listen)
        command, fifo = self.command, os.path.join(p.workdir, GATE)
        if relays.routes:
            Path(fifo).unlink(missing_ok=True)
            os.mkfifo(fifo, 0o644)
            os.chmod(fifo, 0o644)
            command = egress_gate(command, fifo)
        image_env = self.engine.image_env(p.image)
        user = container_user(p, Path(p.workdir))
        self.cid = self.engine.run(ContainerRequest(
            name=p.name, image=p.image, command=command, env=container_env(p, image_env, self.env),
            labels=p.labels, network=p.network, ip=p.ip, nano_cpus=p.nano_cpus, memory=p.memory,
            gpu_ids=p.gpu_ids, mounts=p.mounts, workdir=p.workdir, user=user, pids_limit=p.pids_limit,
            extra_hosts=relays.names or None))
        if relays.routes:
            relays.start()
            for note in relays.notes:
                print(f"[runner] {note}", file=sys.stderr, flush=True)
            # held open until the runner ends: the line stays readable however late the command opens the FIFO
            self._gate = os.open(fifo, os.O_RDWR)
            os.write(self._gate, b"go\n")

    def _listen(self, addresses: list[tuple[str, int]]) -> list:
        view = self.engine.container(self.cid)
        if view is None or not view.pid:
            raise OSError(f"the container {self.plan.name} is not running")
        return listen_in(Path(f"/proc/{view.pid}/ns/net"), addresses, add_addresses=True)

    def wait(self) -> int:
        """The container's exit code; an engine that stops answering is waited for (the learner may run on)."""
        backoff = PATIENT.backoff()
        lost_since = None
        pause = threading.Event()  # never set: a wait that a signal does not cut short
        while True:
            try:
                return self.engine.wait(self.cid)
            except Unavailable as e:
                if lost_since is None:
                    lost_since = e.message
                    print(f"[runner] {e.message}; waiting for the engine to come back", file=sys.stderr, flush=True)
                pause.wait(backoff.next())
            except TrainforgeError as e:
                self.reason(f"the container {self.plan.name} was lost: {e.message}")
                return 255

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        Path(self.plan.reason_path).unlink(missing_ok=True)
        try:
            self.start()
        except EgressError as e:
            self.reason(f"the learner's egress could not be set up: {e}")
            self._remove()
            return EXIT_CANNOT_START
        except TrainforgeError as e:
            self.reason(f"the container could not be started: {e.message}")
            return EXIT_CANNOT_START
        except OSError as e:
            self.reason(f"the container could not be started: preparing {self.plan.workdir} (and the "
                        f"skeleton of /root) for the job's uid failed: {e}")
            return EXIT_CANNOT_START
        # not Loops: byte pumps, each blocked on the engine's log stream until the container's output ends
        pumps = [threading.Thread(target=_pump, args=(self.engine.logs(self.cid, stdout=out, stderr=not out), dst),
                                  daemon=True)
                 for out, dst in ((True, sys.stdout.buffer), (False, sys.stderr.buffer))]
        for t in pumps:
            t.start()
        code = self.wait()
        for t in pumps:
            t.join(10)
        view = self.engine.container(self.cid)
        if view is not None and view.oom_killed:
            self.reason(f"the learner was OOM-killed: it reached its memory limit of {human_bytes(self.plan.memory)} "
                        f"(container {self.plan.name}, exit code {code})")
        elif code != 0 and code in (137, 143) and not self._signalled:
            self.reason(f"the learner's container {self.plan.name} was killed by "
                        f"{'SIGKILL' if code == 137 else 'SIGTERM'} from outside (exit code {code})")
        elif code != 0:
            self.reason(f"the learner exited with code {code} (container {self.plan.name}, image {self.plan.image})")
        self._remove()
        return code

    def _remove(self) -> None:
        """Stop the relays, remove the gate and the container."""
        if self.relays is not None:
            self.relays.stop()
        if self._gate >= 0:
            os.close(self._gate)
            Path(self.plan.workdir, GATE).unlink(missing_ok=True)
        if not self.cid:
            return
        try:
            self.engine.remove_container(self.cid)
        except TrainforgeError as e:
            print(f"[runner] could not remove {self.plan.name}: {e.message}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: runner.py <container plan> <command...>", file=sys.stderr)
        return 2
    plan = ContainerPlan.load(argv[1])
    return Runner(plan, argv[2:], dict(os.environ)).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Hostile learners on the local backend: each job tries to reach what the sandbox hides, and must fail.

Every job runs through the LCM's local backend with the default isolation
(auto) beside the real etcd, Mongo-wire, log store, Trainer and API
servers, twice: with the platform as root (`isolation: sandbox`) and with
its controllers as uid 65534 (`isolation: userns`, the sandbox without
root; no cgroups there, so the pids test is root's only and the memory
limit is the controller's watchdog). A job prints
`BLOCKED <what>` for each attempt that failed and `ESCAPED <what>` for one
that worked; the host side is checked as well (the file not written, the
process still alive). The credential and endpoint probes every backend must
pass (the same learner on the local sandbox, docker and the Kubernetes test
node) are tests/hostile/probes.py, run by test_hostile_probes.py; these are
the local sandbox's own: its view, writes, limits and cleanup.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from tests.integration.sandbox_jobs import (  # noqa: F401 - fixtures
    nobody_python,
    outcome_lines,
    own_userns_platform,
    platform,
    root_platform,
    unprivileged_platform,
)
from tests.servers import wait_for
from trainforge_services.common import isolation
from trainforge_services.common.adapters.objectstore import store_from_settings
from trainforge_services.common.states import LearnerState

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


PRELUDE = '''
import json, os, signal, socket, sys, time
def attempt(what, fn):
    try:
        result = fn()
    except Exception as e:
        print(f"BLOCKED {what}: {type(e).__name__}: {e}"[:200], flush=True)
        return
    print(f"ESCAPED {what}: {result!r}"[:200], flush=True)
ARGS = json.loads(os.environ["HOSTILE_ARGS"])
'''


def hostile(body: str) -> str:
    return PRELUDE + body


def sandboxed(doc: dict, kind: str = "sandbox") -> list[str]:
    """The BLOCKED lines of a learner that ran in a sandbox (of `kind`) and escaped nowhere."""
    assert doc["isolation"] == kind, doc
    blocked, escaped = outcome_lines(doc)
    assert not escaped, doc["tail"]
    return blocked


def test_cannot_read_the_platforms_files(platform, mongo_server, unique):  # noqa: F811
    config = platform.state_dir / "config.json"
    platform.state_dir.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps({"api_key": "tf-secret-key"}))
    victim = f"victim-{unique}"
    done = platform.run(victim, "open('secret.txt', 'w').write('victim secret')\n")
    assert done["state"] == LearnerState.LEARNER_COMPLETED, platform.log(victim)
    assert (platform.workdir(victim) / "secret.txt").read_text() == "victim secret"
    store = store_from_settings(platform.settings)
    store.put_bytes("datasets/other-team/secret.bin", b"other team's data")
    objects = Path(platform.settings.objectstore().removeprefix("file://"))
    assert (objects / "datasets/other-team/secret.bin").is_file()
    mongo_files = sorted(str(p) for p in Path(mongo_server.data_dir).rglob("*") if p.is_file())
    assert mongo_files, "the Mongo-wire server keeps no data file to try"
    targets = [str(config), str(Path.home() / ".trainforge" / "config.json"), str(platform.workdir(victim) / "secret.txt"),
               str(objects / "datasets/other-team/secret.bin"), mongo_files[0]]
    listings = [str(platform.state_dir), str(platform.state_dir / "work"), str(objects), str(mongo_server.data_dir),
                str(Path.home())]
    job = f"reader-{unique}"
    doc = platform.run(job, hostile('''
for path in ARGS["files"]:
    attempt(f"read {path}", lambda: open(path, "rb").read(40))
for path in ARGS["dirs"]:
    try:
        print("LIST", json.dumps([path, sorted(os.listdir(path))]), flush=True)
    except OSError as e:
        print("LIST", json.dumps([path, type(e).__name__]), flush=True)
attempt("read /proc/1/environ", lambda: open("/proc/1/environ", "rb").read(40))
print("uid", os.getuid(), "pid", os.getpid(), flush=True)
'''), env={"HOSTILE_ARGS": json.dumps({"files": targets, "dirs": listings})})
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, platform.log(job)
    blocked = sandboxed(doc, platform.isolation)
    assert len(blocked) == len(targets) + 1, doc["tail"]
    # A folder above its own workdir shows only the way down to it (and the home only the bound Python: the
    # interpreter's prefix, and the venv's where the platform's venv lies in the home, as tools/py311/run.sh's does).
    own = set(platform.workdir(job).parts) | set(Path(sys.base_prefix).parts) | set(Path(sys.prefix).parts)
    for line in (ln for ln in doc["tail"] if ln.startswith("LIST ")):
        path, seen = json.loads(line.removeprefix("LIST "))
        assert seen == "FileNotFoundError" or set(seen) <= own, (path, seen)
    uid_line = next(ln for ln in doc["tail"] if ln.startswith("uid "))
    assert uid_line.split()[1] != "0" and int(uid_line.split()[3]) < 100, uid_line  # not root; a pid of its own ns


def test_cannot_connect_to_the_platforms_servers(platform, etcd_server, mongo_server, osmem_server,  # noqa: F811
                                                 unique):
    ports = {"etcd": etcd_server.port, "mongo-wire": mongo_server.port, "log store": osmem_server.port,
             "trainer": platform.trainer_port, "api": platform.api_port}
    job = f"net-{unique}"
    doc = platform.run(job, hostile('''
for name, port in ARGS["ports"].items():
    attempt(f"connect {name} 127.0.0.1:{port}", lambda: socket.create_connection(("127.0.0.1", port), 3).close())
attempt("connect a host outside", lambda: socket.create_connection(("1.1.1.1", 443), 3).close())
'''), env={"HOSTILE_ARGS": json.dumps({"ports": ports})})
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, platform.log(job)
    assert len(sandboxed(doc, platform.isolation)) == len(ports) + 1


def test_cannot_signal_the_controller_or_another_jobs_learner(platform, unique):  # noqa: F811
    victim = f"sleeper-{unique}"
    platform.deploy(victim, "import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n")
    victim_learner = wait_for(lambda: next((p for p in psutil.process_iter(["cmdline"])
                                            if (p.info["cmdline"] or [])[-1:] == ["python hostile.py"]
                                            and _env(p).get("TF_JOB_ID") == victim), None), 60, "the victim")
    job = f"killer-{unique}"
    platform.deploy(job, hostile('''
while not os.path.exists("targets.json"):
    time.sleep(0.05)
for name, pid in json.load(open("targets.json")).items():
    sig = signal.SIGKILL if name != "lcm" else 0
    attempt(f"signal {name} (pid {pid})", lambda: os.kill(pid, sig))
'''), env={"HOSTILE_ARGS": "{}"})
    controller = wait_for(lambda: next((p for p in psutil.process_iter(["cmdline"])
                                        if "trainforge_services.controller" in " ".join(p.info["cmdline"] or [])
                                        and f"/{job}/" in " ".join(p.info["cmdline"] or [])), None), 60,
                          "the hostile job's controller")
    targets = {"controller": controller.pid, "victim learner": victim_learner.pid, "lcm": os.getpid()}
    workdir = platform.workdir(job)
    (workdir / "targets.json").write_text(json.dumps(targets))
    doc = platform.final(job)
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, platform.log(job)
    assert len(sandboxed(doc, platform.isolation)) == len(targets)
    assert victim_learner.is_running() and victim_learner.status() != psutil.STATUS_ZOMBIE
    assert platform.status(victim)["state"] == LearnerState.LEARNER_RUNNING


def test_cannot_fork_past_the_pids_limit(platform, unique):  # noqa: F811
    if platform.isolation == "userns":
        pytest.skip("no pids limit without root (cgroups need it; docs/THREAT_MODEL.md)")
    job = f"forks-{unique}"
    doc = platform.run(job, hostile('''
kids = []
def bomb():
    while len(kids) < 2000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
    return len(kids)
attempt("fork 2000 processes", bomb)
print("forked", len(kids), flush=True)
for k in kids:
    os.kill(k, signal.SIGKILL)
'''), env={"HOSTILE_ARGS": "{}"}, pids=64)
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, platform.log(job)
    assert len(sandboxed(doc, platform.isolation)) == 1
    forked = int(next(ln for ln in doc["tail"] if ln.startswith("forked ")).split()[1])
    assert forked < 64, doc["tail"]


def test_cannot_allocate_past_the_memory_limit(platform, unique):  # noqa: F811
    job = f"hog-{unique}"
    doc = platform.run(job, hostile('''
print("allocating", flush=True)
blocks = [bytearray(16 * 2**20) for _ in range(40)]
time.sleep(30)  # the cgroup kills it above; without one, the watchdog (polling every second) must
print("ESCAPED held 640Mi for 30s", flush=True)
'''), env={"HOSTILE_ARGS": "{}"}, memory="128Mi")
    assert doc["state"] == LearnerState.LEARNER_FAILED, doc
    assert doc["isolation"] == platform.isolation
    if platform.isolation == "userns":  # no memory cgroup: the controller's watchdog stops it
        assert doc["message"].startswith("memory limit exceeded: ") and doc["message"].endswith(" > 128.0Mi"), doc
    else:
        assert doc["exit_code"] == 128 + signal.SIGKILL
        assert doc["message"] == ("memory limit exceeded: out of memory (OOM kill) in the learner's cgroup, "
                                  "limit 128.0Mi")
    assert not any(ln.startswith("ESCAPED") for ln in doc["tail"])


def test_cannot_write_outside_its_workdir(platform, unique):  # noqa: F811
    job = f"writer-{unique}"
    workdir = platform.workdir(job)
    targets = ["/etc/tf-escape", "/usr/tf-escape", "/tf-escape", str(workdir.parent / "tf-escape"),
               str(platform.state_dir / "tf-escape"), str(Path(sys.prefix) / "tf-escape"),
               str(Path.home() / "tf-escape")]
    doc = platform.run(job, hostile('''
for path in ARGS["paths"]:
    attempt(f"write {path}", lambda: open(path, "w").write("x"))
open("mine.txt", "w").write("ok")
open("/tmp/private.txt", "w").write("ok")
print("wrote the workdir and /tmp", flush=True)
'''), env={"HOSTILE_ARGS": json.dumps({"paths": targets})})
    assert doc["state"] == LearnerState.LEARNER_COMPLETED, platform.log(job)
    # a target below /tmp (a checkout or venv there, as in a CI clone) lies on the learner's private /tmp in
    # the view, where a write is its own (docs/THREAT_MODEL.md); the host never sees it, checked below
    private = [p for p in targets if Path(p).is_relative_to("/tmp")]
    assert doc["isolation"] == platform.isolation, doc
    blocked, escaped = outcome_lines(doc)
    assert all(any(f"write {p}:" in line for p in private) for line in escaped), doc["tail"]
    assert len(targets) - len(private) <= len(blocked) <= len(targets)
    assert "wrote the workdir and /tmp" in doc["tail"]
    assert not any(Path(p).exists() for p in targets)
    assert (workdir / "mine.txt").read_text() == "ok"
    assert not Path("/tmp/private.txt").exists()  # its /tmp was its own


def test_the_jobs_netns_and_cgroups_are_removed_when_it_is_killed(platform, unique):  # noqa: F811
    job = f"clean-{unique}"
    platform.deploy(job, "import time\ntime.sleep(300)\n")
    wait_for(lambda: (platform.status(job) or {}).get("state") == LearnerState.LEARNER_RUNNING, 60, "the learner")
    if platform.isolation == "userns":  # the job's namespaces are its holder's, ended by the backend's stop
        holder = psutil.Process(int((platform.state_dir / "work" / job / ".userns-holder").read_text()))
        assert holder.environ()["TF_JOB_ID"] == job
        platform.lifecycle.kill(job)
        assert not holder.is_running() or holder.status() == psutil.STATUS_ZOMBIE
        return
    assert (isolation.NETNS_DIR / isolation.netns_name(job)).exists()
    assert all(p.is_dir() for p in isolation.job_cgroups(job))
    platform.lifecycle.kill(job)
    assert not (isolation.NETNS_DIR / isolation.netns_name(job)).exists()
    assert not any(p.exists() for p in isolation.job_cgroups(job))


def test_the_ranks_of_a_job_reach_each_other(platform, unique):  # noqa: F811
    job = f"ranks-{unique}"
    platform.deploy(job, hostile('''
rank = int(os.environ["TF_RANK"])
if rank == 0:
    server = socket.create_server(("127.0.0.1", 29517))
    server.settimeout(60)
    conn, _ = server.accept()
    print("RANK0 GOT", conn.recv(64).decode(), flush=True)
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", 29517), 3).sendall(b"hello from rank 1")
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    print("RANK1 SENT", flush=True)
'''), learners=2, env={"HOSTILE_ARGS": "{}"})
    docs = [platform.final(job, rank) for rank in (0, 1)]
    assert [d["state"] for d in docs] == [LearnerState.LEARNER_COMPLETED] * 2, platform.log(job)
    assert [d["isolation"] for d in docs] == [platform.isolation] * 2
    assert "RANK0 GOT hello from rank 1" in docs[0]["tail"] and "RANK1 SENT" in docs[1]["tail"]


def _env(proc: psutil.Process) -> dict:
    try:
        return proc.environ()
    except psutil.Error:
        return {}

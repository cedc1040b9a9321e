"""The real Kubernetes control-plane tier: kube-apiserver + kube-controller-manager (tests/kube.py) and the test
node (tests/kubenode/), through the `kubernetes` client as the backend uses it."""

from __future__ import annotations

import json
import os
import sys
import uuid

import psutil
import pytest

from tests.kube import api_client, external_cluster
from tests.servers import free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]
PY = sys.executable


@pytest.fixture(scope="module")
def api(kube_cluster):
    c = api_client(kube_cluster)
    yield c
    c.close()


@pytest.fixture
def core(api):
    from kubernetes import client

    return client.CoreV1Api(api)


@pytest.fixture
def ns(core):
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def _pod(name: str, command: list[str], **extra) -> dict:
    container = {"name": "main", "image": "trainforge/learner:test", "command": command, **extra.pop("container", {})}
    return {"metadata": {"name": name, "labels": {"app": "kube-plane-test"}},
            "spec": {"restartPolicy": "Never", "containers": [container], **extra}}


def _wait_pod(core, ns: str, name: str, check, what: str, timeout: float = 60):
    return wait_for(lambda: check(p := core.read_namespaced_pod(name, ns)) and p, timeout, what, interval=0.2)


def _log(node, pod) -> str:
    d = node.workdir / "pods" / f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.metadata.uid}"
    return (d / "main.log").read_text()


def test_the_control_plane_serves_and_its_controllers_run(kube_cluster, api, core):
    from kubernetes import client

    version = client.VersionApi(api).get_code()
    # the built control plane is Debian's 1.20; a cluster of your own (TF_KUBE_SERVER) may be any 1.x
    assert version.git_version.startswith("v1." if external_cluster() else "v1.20."), version.git_version
    # the serviceaccount controller (kube-controller-manager) made the default account in every namespace
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        wait_for(lambda: core.read_namespaced_service_account("default", name), 30, "the default service account")
    finally:
        core.delete_namespace(name)
    kubeconfig = json.loads(kube_cluster.kubeconfig.read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == kube_cluster.server


def test_resource_quota_refuses_a_pod_over_the_teams_gpus_in_its_own_words(core, ns):
    from kubernetes.client.exceptions import ApiException

    core.create_namespaced_resource_quota(ns, {"metadata": {"name": "team-gpus"},
                                               "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}})
    # admission enforces a quota only once the resourcequota controller has written its status
    wait_for(lambda: (core.read_namespaced_resource_quota("team-gpus", ns).status.hard or {}).get(
        "requests.nvidia.com/gpu") == "2", 30, "the quota controller to fill the quota's status")
    gpus = {"requests": {"nvidia.com/gpu": "3"}, "limits": {"nvidia.com/gpu": "3"}}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(ns, _pod("too-many", ["true"], container={"resources": gpus}))
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert "exceeded quota: team-gpus" in message
    assert "requested: requests.nvidia.com/gpu=3" in message and "limited: requests.nvidia.com/gpu=2" in message
    ok = {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}
    core.create_namespaced_pod(ns, _pod("fits", ["true"], container={"resources": ok}))
    wait_for(lambda: (core.read_namespaced_resource_quota("team-gpus", ns).status.used or {}).get(
        "requests.nvidia.com/gpu") == "2", 30, "the quota to count the admitted pod")


def test_deleting_the_root_object_lets_the_garbage_collector_remove_its_children(core, ns):
    root = core.create_namespaced_config_map(ns, {"metadata": {"name": "attempt-root"}})
    owner = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "attempt-root", "uid": root.metadata.uid,
              "controller": True, "blockOwnerDeletion": True}]
    core.create_namespaced_service(ns, {"metadata": {"name": "job-1", "ownerReferences": owner},
                                        "spec": {"clusterIP": "None", "selector": {"job": "1"}}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "child", "ownerReferences": owner}})
    core.create_namespaced_pod(ns, {**_pod("rank-0", ["true"]),
                                    "metadata": {"name": "rank-0", "ownerReferences": owner}})

    def children() -> list[str]:
        return ([s.metadata.name for s in core.list_namespaced_service(ns).items]
                + [c.metadata.name for c in core.list_namespaced_config_map(ns).items
                   if c.metadata.name not in ("kube-root-ca.crt", "attempt-root")]
                + [p.metadata.name for p in core.list_namespaced_pod(ns).items])

    assert sorted(children()) == ["child", "job-1", "rank-0"]
    core.delete_namespaced_config_map("attempt-root", ns, body={"propagationPolicy": "Background"})
    wait_for(lambda: children() == [], 60, "the garbage collector to remove the root's children")


def test_testnode_runs_a_pod_to_succeeded_with_its_env(core, ns, kube_node):
    core.create_namespaced_secret(ns, {"metadata": {"name": "creds"}, "stringData": {"key": "s3cret"}})
    script = ("import os; print('|'.join(os.environ[k] for k in ('RANK', 'POD', 'NS', 'IP', 'ADDR', 'SECRET'))); "
              "print(os.getcwd()); open('out.txt', 'w').write('written')")
    env = [{"name": "RANK", "value": "0"},
           {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "ADDR", "value": "$(IP):29500"},
           {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "key"}}}]
    spec = _pod("ok", [PY, "-c", script], container={"env": env, "workingDir": "/scratch",
                                                      "volumeMounts": [{"name": "work", "mountPath": "/scratch"}]},
                volumes=[{"name": "work", "emptyDir": {}}],
                initContainers=[{"name": "init", "image": "busybox", "command": [PY, "-c", "open('/scratch/x','w')"],
                                 "volumeMounts": [{"name": "work", "mountPath": "/scratch"}]}])
    core.create_namespaced_pod(ns, spec)
    pod = _wait_pod(core, ns, "ok", lambda p: p.status.phase == "Succeeded", "the pod to succeed")
    assert pod.spec.node_name == kube_node.name
    assert pod.status.pod_ip == "127.0.0.1"
    state = pod.status.container_statuses[0].state.terminated
    assert (state.exit_code, state.reason) == (0, "Completed")
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 0
    assert pod.status.container_statuses[0].image == "trainforge/learner:test"
    out = _log(kube_node, pod).splitlines()
    assert out[0] == f"0|ok|{ns}|127.0.0.1|127.0.0.1:29500|s3cret"
    workdir = out[1]
    assert workdir != "/scratch" and workdir.endswith("/volumes/work")  # the emptyDir, a directory of the pod
    assert sorted(os.listdir(workdir)) == ["out.txt", "x"]


def test_testnode_fails_a_pod_with_its_exit_code(core, ns, kube_node):
    core.create_namespaced_pod(ns, _pod("bad", [PY, "-c", "import sys; print('boom'); sys.exit(3)"]))
    pod = _wait_pod(core, ns, "bad", lambda p: p.status.phase == "Failed", "the pod to fail")
    state = pod.status.container_statuses[0].state.terminated
    assert (state.exit_code, state.reason) == (3, "Error")
    assert _log(kube_node, pod) == "boom\n"


def test_testnode_runs_two_containers_that_meet_in_a_shared_empty_dir_each_with_its_exit_code(core, ns, kube_node):
    # the learner pod's shape: one container with a Secret in its env, one without, meeting in an emptyDir
    core.create_namespaced_secret(ns, {"metadata": {"name": "creds"}, "stringData": {"key": "s3cret"}})
    mount = {"volumeMounts": [{"name": "share", "mountPath": "/share"}]}
    writer = ("import os, pathlib; pathlib.Path('/share/go').write_text(os.environ['SECRET']); "
              "print(sorted(k for k in os.environ if k == 'SECRET'))")
    reader = ("import os, pathlib, sys, time\n"
              "while not pathlib.Path('/share/go').exists(): time.sleep(0.05)\n"
              "print(pathlib.Path('/share/go').read_text(), 'SECRET' in os.environ); sys.exit(3)\n")
    spec = _pod("pair", [PY, "-c", writer.replace("/share", "$(SHARE)")],
                container={"name": "controller", **mount, "env": [
                    {"name": "SHARE", "value": "/share"},
                    {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "key"}}}]},
                volumes=[{"name": "share", "emptyDir": {}}], shareProcessNamespace=False)
    spec["spec"]["containers"].append({"name": "learner", "image": "trainforge/learner:test",
                                       "command": [PY, "-c", reader.replace("/share", "$(SHARE)")],
                                       "env": [{"name": "SHARE", "value": "/share"}], **mount})
    core.create_namespaced_pod(ns, spec)
    pod = _wait_pod(core, ns, "pair", lambda p: p.status.phase in ("Succeeded", "Failed"), "the pod to end")
    assert pod.status.phase == "Failed"  # the pod's phase follows both: one exited 3
    codes = {c.name: c.state.terminated.exit_code for c in pod.status.container_statuses}
    assert codes == {"controller": 0, "learner": 3}
    d = kube_node.workdir / "pods" / f"{ns}_pair_{pod.metadata.uid}"
    assert (d / "controller.log").read_text() == "['SECRET']\n"
    assert (d / "learner.log").read_text() == "s3cret False\n"  # it read the share, not the Secret
    assert (d / "volumes" / "share" / "go").read_text() == "s3cret"


def test_testnode_reports_a_missing_secret_as_create_container_config_error(core, ns, kube_node):
    env = [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]
    core.create_namespaced_pod(ns, _pod("nosecret", [PY, "-c", "pass"], container={"env": env}))

    def waiting(p):
        s = (p.status.container_statuses or [None])[0]
        return s is not None and s.state.waiting is not None and s.state.waiting.reason == "CreateContainerConfigError"

    pod = _wait_pod(core, ns, "nosecret", waiting, "CreateContainerConfigError")
    assert pod.status.container_statuses[0].state.waiting.message == 'secret "absent" not found'
    assert pod.status.phase == "Pending"


def test_testnode_kills_a_deleted_pods_process_after_the_grace_period(core, ns, kube_node):
    # the process ignores SIGTERM, so only the SIGKILL after the grace period ends it
    script = "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(os.getpid(), flush=True); time.sleep(600)"
    core.create_namespaced_pod(ns, _pod("sleeper", [PY, "-c", script]))
    pod = _wait_pod(core, ns, "sleeper", lambda p: p.status.phase == "Running", "the pod to run")
    assert pod.status.container_statuses[0].state.running is not None
    pid = int(wait_for(lambda: _log(kube_node, pod).strip(), 30, "the process to print its pid"))
    assert psutil.pid_exists(pid)
    core.delete_namespaced_pod("sleeper", ns, grace_period_seconds=2)
    from kubernetes.client.exceptions import ApiException

    def gone() -> bool:
        try:
            core.read_namespaced_pod("sleeper", ns)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(gone, 30, "the test node to finish the pod's deletion")
    wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10,
             "the process to be gone")


def test_testnode_marks_a_pod_that_does_not_fit_unschedulable(core, ns, kube_node):
    gpus = {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    core.create_namespaced_pod(ns, _pod("huge", [PY, "-c", "pass"], container={"resources": gpus}))
    core.create_namespaced_pod(ns, _pod("elsewhere", [PY, "-c", "pass"], nodeSelector={"trainforge.io/gpu-type": "h100"}))

    def unschedulable(p):
        return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                   for c in p.status.conditions or [])

    huge = _wait_pod(core, ns, "huge", unschedulable, "the Unschedulable condition")
    msg = next(c.message for c in huge.status.conditions if c.type == "PodScheduled")
    assert msg == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    other = _wait_pod(core, ns, "elsewhere", unschedulable, "the Unschedulable condition")
    assert next(c.message for c in other.status.conditions if c.type == "PodScheduled") == (
        "0/1 nodes are available: 1 node(s) didn't match node selector.")
    assert huge.spec.node_name is None and huge.status.phase == "Pending"
    # a pod that fits (4 GPUs, the node's label) is bound and run
    fits = {"requests": {"nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "4"}}
    core.create_namespaced_pod(ns, _pod("fits", [PY, "-c", "pass"], container={"resources": fits},
                                        nodeSelector={"trainforge.io/gpu-type": "test"}))
    _wait_pod(core, ns, "fits", lambda p: p.status.phase == "Succeeded", "the fitting pod to succeed")


def test_testnode_restarts_a_failing_container_under_on_failure(core, ns, kube_node):
    # fails on the first run, succeeds on the second: the emptyDir keeps the marker across the restart
    script = "import os, sys; m = '/scratch/ran'; first = not os.path.exists(m); open(m, 'w'); sys.exit(1 if first else 0)"
    spec = _pod("flaky", [PY, "-c", script], container={"volumeMounts": [{"name": "s", "mountPath": "/scratch"}]},
                volumes=[{"name": "s", "emptyDir": {}}])
    spec["spec"]["restartPolicy"] = "OnFailure"
    core.create_namespaced_pod(ns, spec)
    pod = _wait_pod(core, ns, "flaky", lambda p: p.status.phase == "Succeeded", "the restarted pod to succeed")
    status = pod.status.container_statuses[0]
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 1
    assert status.state.terminated.exit_code == 0


def test_testnode_killed_leaves_its_pods_and_the_fixture_ends_their_processes(core, ns, kube_node):
    script = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    core.create_namespaced_pod(ns, _pod("orphan", [PY, "-c", script]))
    pod = _wait_pod(core, ns, "orphan", lambda p: p.status.phase == "Running", "the pod to run")
    pid = int(wait_for(lambda: _log(kube_node, pod).strip(), 30, "the process to print its pid"))
    kube_node.kill()  # a lost node: nobody reports for the pod any more, its process keeps running
    assert psutil.pid_exists(pid)
    assert core.read_namespaced_pod("orphan", ns).status.phase == "Running"
    kube_node.stop()  # what the fixture's teardown does: the recorded process groups are killed
    wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10,
             "the orphaned process to be killed")


def test_testnode_pods_rendezvous_through_the_headless_service_name(core, ns, kube_node):
    # the DDP pattern: rank 0 listens on MASTER_PORT, rank 1 reaches it by its Service DNS name, which the test
    # node rewrites to the loopback address every pod shares (there is no cluster DNS)
    port = free_port()
    core.create_namespaced_service(ns, {"metadata": {"name": "job-1"},
                                        "spec": {"clusterIP": "None", "selector": {"job": "1"},
                                                 "ports": [{"name": "ddp", "port": port}]}})
    master = f"job-1-0.job-1.{ns}.svc.cluster.local"
    env = [{"name": "MASTER_ADDR", "value": master}, {"name": "MASTER_PORT", "value": str(port)}]
    server = ("import os, socket; s = socket.create_server(('', int(os.environ['MASTER_PORT']))); "
              "c, _ = s.accept(); print(c.recv(100).decode(), flush=True)")
    client = ("import os, socket, time\n"
              "deadline = time.monotonic() + 30\n"
              "while True:\n"
              "    try:\n"
              "        c = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])))\n"
              "        break\n"
              "    except OSError:\n"
              "        if time.monotonic() > deadline: raise\n"
              "        time.sleep(0.1)\n"
              "c.sendall(b'hello from rank 1 via ' + os.environ['MASTER_ADDR'].encode())\n")
    for rank, script in ((0, server), (1, client)):
        spec = _pod(f"job-1-{rank}", [PY, "-c", script], container={"env": env}, hostname=f"job-1-{rank}",
                    subdomain="job-1")
        spec["metadata"]["labels"]["job"] = "1"
        core.create_namespaced_pod(ns, spec)
    pods = [_wait_pod(core, ns, f"job-1-{r}", lambda p: p.status.phase in ("Succeeded", "Failed"), "the ranks")
            for r in (0, 1)]
    assert [p.status.phase for p in pods] == ["Succeeded", "Succeeded"], [_log(kube_node, p) for p in pods]
    assert _log(kube_node, pods[0]) == "hello from rank 1 via 127.0.0.1\n"

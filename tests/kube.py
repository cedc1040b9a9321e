"""A real Kubernetes control plane for tests: etcd, kube-apiserver and kube-controller-manager on loopback.

The binaries come from tools/kube/build.sh (`make kube`), cached in the
per-user cache (`~/.cache/trainforge/kube/<debian-version>-<hash>/bin/`,
found through tests/toolcache.py). `start_control_plane()` makes a CA, a
serving certificate and service-account keys in a temporary directory,
starts its own etcd (tests/servers.py), then kube-apiserver (token
authentication, RBAC, the default admission plugins but ServiceAccount) and
kube-controller-manager (job, namespace, garbage collector, resource quota,
service account and endpoint controllers), each on free loopback ports, and
returns once `/readyz` answers ok and the controller manager has made the
`default` service account (proof that it talks to the apiserver). Anything
that goes wrong raises `KubeUnavailable` with the reason and the log tail:
the tier fails, it never skips.

The `kube_cluster` fixture (session scope, registered for every tier in
tests/conftest.py) yields a frozen `KubeCluster`; `api_client(cluster)`
makes a `kubernetes.client.ApiClient` for it. There is no kubelet and no
scheduler: the `kube_node` fixture (tests/kubenode/) adds the test node.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import servers, toolcache
from tests.servers import free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
CONTROLLERS = "job,namespace,garbagecollector,resourcequota,serviceaccount,serviceaccount-token,endpoint,endpointslice"
SERVICE_CIDR = "10.96.0.0/24"


class KubeUnavailable(RuntimeError):
    """The control plane could not be set up or started; the message says why."""


@dataclass(frozen=True)
class KubeCluster:
    """How a test reaches the control plane: the apiserver URL, an admin bearer token, a kubeconfig file
    (same server and token, for kubectl/helm), the CA that signed the apiserver's certificate, and the
    directory holding the Kubernetes binaries."""

    server: str
    token: str
    kubeconfig: Path
    ca_file: Path
    bin_dir: Path


def bin_dir() -> Path:
    """The built binaries: TF_KUBE_BIN, else the folder tools/kube/build.sh builds for this tree's script."""
    explicit = os.environ.get("TF_KUBE_BIN")
    try:
        d = Path(explicit) if explicit else toolcache.where("kube") / "bin"
    except RuntimeError as e:
        raise KubeUnavailable(str(e)) from None
    for name in ("kube-apiserver", "kube-controller-manager"):
        if not os.access(d / name, os.X_OK):
            raise KubeUnavailable(f"{d / name} is missing: run `make kube` (tools/kube/build.sh, about 15-25 "
                                  "minutes the first time on a machine)")
    return d


@dataclass
class ControlPlane:
    """The running processes behind a KubeCluster; `stop()` ends them by pid and removes the directory."""

    cluster: KubeCluster
    work: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    etcd: servers.Server | None = None

    def stop(self, timeout: float = 15) -> None:
        # controllers first, so nothing writes while the apiserver goes, etcd last
        for name in ("kube-controller-manager", "kube-apiserver"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        if self.etcd is not None:
            self.etcd.cleanup()
        shutil.rmtree(self.work, ignore_errors=True)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        try:
            return (self.work / f"{name}.log").read_text(errors="replace")[-chars:]
        except OSError as e:
            return f"(no log: {e})"


def _write_pki(d: Path) -> tuple[Path, Path, Path, Path, Path]:
    """A CA, a serving certificate for 127.0.0.1/localhost signed by it, and a service-account key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    def pem_key(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                 serialization.NoEncryption())

    now = datetime.datetime.now(datetime.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainforge-test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sans = [x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("10.96.0.1"))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    paths = (d / "ca.crt", d / "apiserver.crt", d / "apiserver.key", d / "sa.key", d / "sa.pub")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(pem_key(key))
    paths[3].write_bytes(pem_key(sa_key))
    paths[4].write_bytes(sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
    return paths


def write_kubeconfig(path: Path, server: str, token: str, ca_file: Path, user: str = "admin") -> Path:
    """A kubeconfig (JSON is valid YAML) with one cluster, one token user and a current context."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "trainforge-test",
        "clusters": [{"name": "trainforge-test", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "trainforge-test", "context": {"cluster": "trainforge-test", "user": user}}],
    }, indent=1))
    path.chmod(0o600)
    return path


def _get(cluster: KubeCluster, path: str, timeout: float = 3) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    req = urllib.request.Request(cluster.server + path, headers={"Authorization": f"Bearer {cluster.token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _spawn(cp: ControlPlane, name: str, argv: list[str]) -> subprocess.Popen:
    with open(cp.work / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    cp.procs[name] = proc
    return proc


def _wait(cp: ControlPlane, name: str, check, timeout: float, what: str) -> None:
    proc = cp.procs[name]

    def ready():
        if proc.poll() is not None:
            raise KubeUnavailable(f"{name} exited with {proc.returncode} while waiting for {what}; its log "
                                  f"({cp.work / (name + '.log')}):\n{cp.log_tail(name)}")
        return check()

    try:
        wait_for(ready, timeout, what, interval=0.2)
    except TimeoutError as e:
        raise KubeUnavailable(f"{e}; {name} log:\n{cp.log_tail(name)}") from None


def start_control_plane(timeout: float = 180) -> ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager, ready; KubeUnavailable with the reason otherwise."""
    bins = bin_dir()
    work = Path(tempfile.mkdtemp(prefix="tf-kube-"))
    ca, crt, key, sa_key, sa_pub = _write_pki(work)
    token = secrets.token_hex(16)
    kcm_token = secrets.token_hex(16)
    tokens = work / "tokens.csv"
    # the controller manager gets a system:masters token too: without per-controller service-account
    # credentials its own bootstrap role does not cover every controller it runs
    tokens.write_text(f'{token},admin,admin-uid,"system:masters"\n'
                      f'{kcm_token},system:kube-controller-manager,kcm-uid,"system:masters"\n')
    port = free_port()
    server = f"https://127.0.0.1:{port}"
    cluster = KubeCluster(server=server, token=token, kubeconfig=write_kubeconfig(work / "kubeconfig", server, token, ca),
                          ca_file=ca, bin_dir=bins)
    cp = ControlPlane(cluster=cluster, work=work)
    try:
        cp.etcd = servers.start_etcd()
        _spawn(cp, "kube-apiserver", [
            str(bins / "kube-apiserver"), f"--etcd-servers={cp.etcd.url}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", "--insecure-port=0", f"--cert-dir={work / 'certs'}",
            f"--tls-cert-file={crt}", f"--tls-private-key-file={key}", f"--client-ca-file={ca}",
            f"--token-auth-file={tokens}", "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_pub}", f"--service-account-signing-key-file={sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--disable-admission-plugins=ServiceAccount",
            "--profiling=false", "--logtostderr=true", "--v=1"])
        _wait(cp, "kube-apiserver", lambda: _get(cluster, "/readyz")[0] == 200, timeout, "kube-apiserver /readyz")
        kcm_config = write_kubeconfig(work / "kcm.kubeconfig", server, kcm_token, ca, "kube-controller-manager")
        _spawn(cp, "kube-controller-manager", [
            str(bins / "kube-controller-manager"), f"--kubeconfig={kcm_config}", "--leader-elect=false",
            "--port=0", "--secure-port=0", f"--controllers={CONTROLLERS}",
            f"--service-account-private-key-file={sa_key}", f"--root-ca-file={ca}",
            "--profiling=false", "--logtostderr=true", "--v=1"])
        _wait(cp, "kube-controller-manager",
              lambda: _get(cluster, "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
              timeout, "kube-controller-manager to create the default service account")
    except BaseException:
        cp.stop()
        raise
    return cp


def api_client(cluster: KubeCluster):
    """A kubernetes.client.ApiClient that talks to `cluster` as the admin."""
    from kubernetes import client

    conf = client.Configuration()
    conf.host = cluster.server
    conf.ssl_ca_cert = str(cluster.ca_file)
    conf.api_key = {"authorization": cluster.token}
    conf.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(conf)


@dataclass
class NodeProcess:
    """A running test node (`python -m tests.kubenode`): its Node name, process and work directory."""

    name: str
    proc: subprocess.Popen
    workdir: Path

    @property
    def log(self) -> Path:
        return self.workdir / "node.log"

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM (the node stops its pods' processes), SIGKILL after timeout; then any process group it
        started and left (a node that was killed) is killed too."""
        from tests.kubenode.pod import kill_recorded

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        kill_recorded(self.workdir / "pgids")

    def kill(self) -> None:
        """SIGKILL the node alone, as a lost node: its pods' processes and statuses stay as they are."""
        self.proc.kill()
        self.proc.wait(10)


def start_node(cluster: KubeCluster, name: str, *, gpus: int = 0, cpu: str = "8", memory: str = "32Gi",
               labels: dict[str, str] | None = None, taints: list[str] = (), env: dict[str, str] | None = None,
               schedule: bool = True, timeout: float = 60) -> NodeProcess:
    """Start the test node as a process and return once its Node is Ready in the API."""
    workdir = Path(tempfile.mkdtemp(prefix=f"tf-kubenode-{name}-"))
    argv = [sys.executable, "-m", "tests.kubenode", "--kubeconfig", str(cluster.kubeconfig), "--name", name,
            "--workdir", str(workdir), "--cpu", cpu, "--memory", memory, "--gpus", str(gpus)]
    argv += [a for k, v in (labels or {}).items() for a in ("--label", f"{k}={v}")]
    argv += [a for t in taints for a in ("--taint", t)]
    argv += [a for k, v in (env or {}).items() for a in ("--env", f"{k}={v}")]
    argv += [] if schedule else ["--no-schedule"]
    penv = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with open(workdir / "node.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                                env=penv, start_new_session=True)
    node = NodeProcess(name, proc, workdir)

    def ready() -> bool:
        if proc.poll() is not None:
            raise KubeUnavailable(f"the test node exited with {proc.returncode}:\n"
                                  f"{node.log.read_text(errors='replace')[-3000:]}")
        status, body = _get(cluster, f"/api/v1/nodes/{name}")
        if status != 200:
            return False
        conds = json.loads(body).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    try:
        wait_for(ready, timeout, f"test node {name} to be Ready", interval=0.2)
    except BaseException:
        node.stop()
        raise
    return node


@pytest.fixture(scope="session")
def kube_cluster():
    """The real control plane (etcd, kube-apiserver, kube-controller-manager) for the session.

    Fails, never skips, when the binaries are missing (`make kube`) or a component does not come up."""
    external = external_cluster()
    if external is not None:
        yield external
        return
    cp = start_control_plane()
    yield cp.cluster
    cp.stop()


def external_cluster() -> KubeCluster | None:
    """A cluster of your own instead of the built one (a kind cluster, say): TF_KUBE_SERVER, TF_KUBE_TOKEN
    (cluster-admin) and TF_KUBE_CA (a PEM file); None when TF_KUBE_SERVER is unset."""
    server = os.environ.get("TF_KUBE_SERVER")
    if not server:
        return None
    missing = [k for k in ("TF_KUBE_TOKEN", "TF_KUBE_CA") if not os.environ.get(k)]
    if missing:
        raise KubeUnavailable(f"TF_KUBE_SERVER is set but {', '.join(missing)} is not")
    ca, token = Path(os.environ["TF_KUBE_CA"]), os.environ["TF_KUBE_TOKEN"]
    kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp(prefix="tf-kube-ext-")) / "kubeconfig", server, token, ca)
    return KubeCluster(server=server, token=token, kubeconfig=kubeconfig, ca_file=ca,
                       bin_dir=Path(os.environ.get("TF_KUBE_BIN", "")))


@pytest.fixture
def kube_node(kube_cluster):
    """One test node (8 cpu, 32Gi, 4 nvidia.com/gpu, label trainforge.io/gpu-type=test) for one test; the
    Node object is deleted afterwards so the next test's node schedules alone."""
    name = f"testnode-{secrets.token_hex(3)}"
    node = start_node(kube_cluster, name, gpus=4, labels={"trainforge.io/gpu-type": "test"})
    yield node
    node.stop()
    _delete(kube_cluster, f"/api/v1/nodes/{name}")
    shutil.rmtree(node.workdir, ignore_errors=True)


def _delete(cluster: KubeCluster, path: str) -> None:
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    req = urllib.request.Request(cluster.server + path, method="DELETE",
                                 headers={"Authorization": f"Bearer {cluster.token}"})
    try:
        urllib.request.urlopen(req, timeout=10, context=ctx).close()
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise

"""Hostile-learner probes: a job's command (`python probes.py`) that tries to reach what is not its own.

Run as the learner's script with HOSTILE_ARGS (JSON) in its environment:
`backend` (which probes apply: APPLIES), `canary` (a marker the test put in
the platform's secrets: an environment or file holding it leaked), the
`files` and folders it tries to read, and `endpoints`: the platform's
addresses, as a hostile user would know them. Each probe prints one line
`PROBE {"probe", "tried", "escaped", "result"}`; `escaped` is true only when
the learner got something it must not have: a credential, a file's bytes,
data from an endpoint, the right to signal or trace a platform process. An
endpoint that answers but refuses the caller (authentication) is not an
escape. Only the standard library is needed; the gRPC probes use `grpc`
where the interpreter has it (the platform's does).

On a backend without isolation (the Kubernetes test node) only the endpoint
probes apply: each must be refused by the endpoint's authentication.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import re
import socket
import struct
import urllib.error
import urllib.request

CREDENTIAL = re.compile(r"SECRET|TOKEN|PASSW|CREDENTIAL|ACCESS_KEY|API_KEY|PRIVATE|AUTH", re.I)
NOT_CREDENTIALS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_CA_BUNDLE",
                   "HOSTILE_ARGS")
SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SECRET_DIRS = ("/run/secrets", "/var/run/secrets", "/etc/secrets")
TIMEOUT = 10.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to the address, no proxy
PROBES: dict[str, tuple[str, object]] = {}  # name -> (kind, function(args) -> (tried, escaped, result))


def probe(kind: str):
    def register(fn):
        PROBES[fn.__name__] = (kind, fn)
        return fn
    return register


# which kinds of probe apply on each backend (the Kubernetes test node runs no isolation: endpoints only)
APPLIES = {"sandbox": ("credential", "endpoint", "process"), "userns": ("credential", "endpoint", "process"),
           "docker": ("credential", "endpoint", "process"), "kubernetes": ("endpoint",)}


def applies(backend: str) -> list[str]:
    return [name for name, (kind, _) in PROBES.items() if kind in APPLIES[backend]]


def _leaks(name: str, value: str, canary: str) -> bool:
    if name in NOT_CREDENTIALS:
        return False
    return bool(CREDENTIAL.search(name)) or name.startswith("AWS_") or (bool(canary) and canary in value)


def _read(path: str, limit: int = 200) -> bytes:
    with open(path, "rb") as f:
        return f.read(limit)


# -- credentials ---------------------------------------------------------------------------------------------

@probe("credential")
def own_environment(args):
    found = sorted(k for k, v in os.environ.items() if _leaks(k, v, args["canary"]))
    return "its own environment for TF_*/AWS_*/token-like variables", bool(found), f"found {found}"


@probe("credential")
def proc_environ(args):
    me, readable, leaked = os.getpid(), 0, []
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != me):
        try:
            raw = _read(f"/proc/{pid}/environ", 1 << 20)
        except OSError:
            continue
        readable += 1
        pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
        names = sorted({k for k, _, v in pairs if _leaks(k, v, args["canary"])})
        if names:
            leaked.append(f"{pid}: {names[:4]}")
    return "/proc/*/environ of every process it can see", bool(leaked), f"{readable} readable; leaks: {leaked[:3]}"


def _files(paths):
    got = []
    for path in paths:
        try:
            got.append(f"{path}: {_read(path, 40)!r}")
        except OSError:
            continue
    return got


@probe("credential")
def state_directory(args):
    """The platform's state dir: its planted files (config, another job's workdir, objects, databases), and a
    listing beyond the way down to its own workdir."""
    got = _files(args["files"].get("state", []))
    own = set(os.getcwd().split("/")) | set(args["files"].get("seen_by_design", []))
    for folder in args["files"].get("state_dirs", []):
        try:
            extra = sorted(set(os.listdir(folder)) - own)
        except OSError:
            continue
        if extra:
            got.append(f"listed {folder}: {extra[:5]}")
    return "the state dir's files and folders", bool(got), f"got {got[:3]}"


@probe("credential")
def cli_config(args):
    paths = [*args["files"].get("cli_config", []), os.path.expanduser("~/.trainforge/config.json")]
    got = _files(paths)
    return f"the CLI's config.json ({', '.join(paths)})", bool(got), f"got {got[:2]}"


@probe("credential")
def mounted_secrets(args):
    got = []
    for top in SECRET_DIRS:
        for folder, _, names in os.walk(top):
            got += _files(os.path.join(folder, n) for n in names)
    return f"files under {', '.join(SECRET_DIRS)}", bool(got), f"got {got[:3]}"


@probe("credential")
def service_account_token(args):
    got = _files([SA_TOKEN])
    return SA_TOKEN, bool(got), f"got {got[:1]}"


# -- endpoints -----------------------------------------------------------------------------------------------

def _http(url: str, body: dict | None = None, method: str | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(req, timeout=TIMEOUT) as r:
            return r.status, r.read(400).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(200).decode(errors="replace")


def _endpoint(args, name):
    return args["endpoints"].get(name) or ""


def _try(fn):
    """(escaped, result) of fn() -> (escaped, result); a refused or unreachable connection is no escape."""
    try:
        return fn()
    except (OSError, ValueError) as e:
        return False, f"{type(e).__name__}: {e}"[:200]


@probe("endpoint")
def etcd(args):
    addr = _endpoint(args, "etcd")

    def go():
        key = base64.b64encode(b"\0").decode()
        status, text = _http(f"http://{addr}/v3/kv/range", {"key": key, "range_end": key, "keys_only": True})
        if status == 200 and '"header"' in text:
            return True, f"read the key space: {text[:120]}"
        put = base64.b64encode(b"hostile-probe").decode()
        status2, text2 = _http(f"http://{addr}/v3/kv/put", {"key": put, "value": put})
        return status2 == 200 and '"header"' in text2, f"range: {status} {text[:80]}; put: {status2} {text2[:80]}"
    return f"etcd at {addr}: range over every key, put a key", *_try(go)


@probe("endpoint")
def object_store(args):
    s3 = args["endpoints"].get("s3") or {}

    def go():
        if not s3:
            return False, "no S3 endpoint to try (the store is files: see state_directory)"
        base = f"{s3['endpoint'].rstrip('/')}/{s3['bucket']}"
        listed = _http(f"{base}?list-type=2")
        read = _http(f"{base}/{s3['key']}")
        escaped = listed[0] == 200 or read[0] == 200
        return escaped, f"list: {listed[0]} {listed[1][:60]}; read {s3['key']}: {read[0]} {read[1][:60]}"
    return f"the object store at {s3.get('endpoint')}: list and read another team's object", *_try(go)


@probe("endpoint")
def log_store(args):
    url = _endpoint(args, "logstore")

    def go():
        status, text = _http(f"{url}/_search", {"query": {"match_all": {}}, "size": 3})
        return status == 200 and '"hits"' in text, f"{status} {text[:120]}"
    return f"the log store at {url}: search every index's lines", *_try(go)


def _bson(doc: dict) -> bytes:
    out = b""
    for k, v in doc.items():
        if isinstance(v, int):
            out += b"\x10" + k.encode() + b"\0" + struct.pack("<i", v)
        else:
            s = str(v).encode() + b"\0"
            out += b"\x02" + k.encode() + b"\0" + struct.pack("<i", len(s)) + s
    return struct.pack("<i", len(out) + 5) + out + b"\0"


@probe("endpoint")
def mongo(args):
    addr = _endpoint(args, "mongo")

    def go():
        host, port = addr.rsplit(":", 1)
        body = struct.pack("<I", 0) + b"\0" + _bson({"listDatabases": 1, "$db": "admin"})
        msg = struct.pack("<iiii", 16 + len(body), 1, 0, 2013) + body  # OP_MSG
        with socket.create_connection((host, int(port)), TIMEOUT) as s:
            s.settimeout(TIMEOUT)
            s.sendall(msg)
            reply = s.recv(65536)
        ok = b"\x10ok\0\x01\0\0\0" in reply or b"\x01ok\0" + struct.pack("<d", 1.0) in reply  # ok: 1 or 1.0
        return ok and b"databases" in reply, f"listDatabases answered {reply[21:140]!r}"
    return f"the Mongo-wire server at {addr}: listDatabases", *_try(go)


def _grpc(addr: str, method: str):
    try:
        import grpc
    except ImportError:
        return False, "no grpc module in this interpreter"
    with grpc.insecure_channel(addr) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            reply = call(b"", timeout=TIMEOUT)
            return True, f"answered {len(reply)} bytes"
        except grpc.RpcError as e:
            code = e.code()
            refused = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED,
                               grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.DEADLINE_EXCEEDED)
            return not refused, f"{code.name}: {e.details()}"[:200]


@probe("endpoint")
def trainer_grpc(args):
    addr = _endpoint(args, "trainer")
    return f"the Trainer's gRPC at {addr}: ListJobs", *_try(lambda: _grpc(addr, "/trainforge.v1.Trainer/ListJobs"))


@probe("endpoint")
def lcm_grpc(args):
    addr = _endpoint(args, "lcm")
    return (f"the LCM's gRPC at {addr}: GetCapacity",
            *_try(lambda: _grpc(addr, "/trainforge.v1.LifecycleManager/GetCapacity")))


@probe("endpoint")
def api(args):
    url = _endpoint(args, "api")

    def go():
        status, text = _http(f"{url}/v1/jobs")
        return 200 <= status < 300, f"{status} {text[:100]}"
    return f"the API at {url}: list jobs without a key", *_try(go)


# -- processes -----------------------------------------------------------------------------------------------

def platform_processes() -> list[int]:
    """Its own job's platform processes this learner can see: the controller and the docker backend's runner
    (their command lines name the job's folder)."""
    found, job = [], os.environ.get("TF_JOB_ID", "?").encode()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = _read(f"/proc/{pid}/cmdline", 4096).replace(b"\0", b" ")
        except OSError:
            continue
        if (b"trainforge_services" in cmd or b"runner.py" in cmd) and job in cmd:
            found.append(int(pid))
    return found


@probe("process")
def signal_controller(args):
    got = []
    for pid in platform_processes():
        try:
            os.kill(pid, 0)  # the permission check of any signal, without sending one
            got.append(pid)
        except OSError:
            pass
    return "signal its controller (any platform process it can see)", bool(got), \
        f"visible {platform_processes()}; may signal {got}"


@probe("process")
def ptrace_controller(args):
    libc = ctypes.CDLL(None, use_errno=True)
    got = []
    for pid in platform_processes():
        if libc.ptrace(0x4206, pid, None, None) == 0:  # PTRACE_SEIZE
            got.append(pid)
            libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    return "ptrace its controller (any platform process it can see)", bool(got), f"attached to {got}"


def main() -> None:
    args = json.loads(os.environ["HOSTILE_ARGS"])
    for name in applies(args["backend"]):
        try:
            tried, escaped, result = PROBES[name][1](args)
        except Exception as e:  # noqa: BLE001 - a probe that breaks says so; it escaped nothing
            tried, escaped, result = name, False, f"the probe failed: {type(e).__name__}: {e}"
        print("PROBE " + json.dumps({"probe": name, "tried": tried, "escaped": escaped, "result": str(result)[:300]}),
              flush=True)


if __name__ == "__main__":
    main()

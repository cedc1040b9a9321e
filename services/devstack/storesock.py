"""The embedded stack's MongoDB-wire and log search servers, reachable only through a unix socket.

    python -m trainforge_services.devstack.storesock mongo --socket S (--db FILE | --data-dir DIR) --log-file L
    python -m trainforge_services.devstack.storesock logstore --socket S --binary B [--parent-pid P]

Neither store authenticates its callers: nx-27017 answers no SASL/SCRAM
handshake and osmem-server has no users, and neither listens on a unix
socket of its own. So neither listens on a port. The socket is created
with mode 0600 in the stack's state directory: only the platform's uid
can connect, and a sandboxed learner (another uid, the state directory
hidden from its view) cannot reach it at all.

- mongo: nx-27017's own request handler served on the socket, in this
  process (the package is Python).
- logstore: osmem-server (a Go binary that listens on TCP only) runs in a
  network namespace of its own, where its loopback port is seen by
  nothing outside; this process bridges the socket to it. Where the kernel
  refuses a namespace (no root and no unprivileged user namespaces), it
  says so in its log and the server's port is on the host's loopback.

Clients connect with `mongo_url(path)` (pymongo's `mongodb://<%2F-quoted
path>`) and `logstore_url(path)` (`http+unix://<quoted path>`, which
common/adapters/logstore.py understands).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import quote

log = logging.getLogger("storesock")

SOCKET_MODE = 0o600
MAX_PATH = 107  # bytes of a unix socket's path (sun_path holds 108 with its NUL)
INNER_PORT = 9200  # osmem-server's port inside its own network namespace
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def mongo_url(path: Path | str) -> str:
    """The MongoDB connection string of a server on the unix socket `path`."""
    return "mongodb://" + quote(str(path), safe="")


def logstore_url(path: Path | str) -> str:
    """The log store URL of a server on the unix socket `path`."""
    return "http+unix://" + quote(str(path), safe="")


def socket_answers(path: Path | str) -> bool:
    """Whether something accepts connections on the unix socket `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
        return True


async def _listen(path: Path, handle: Handler) -> asyncio.AbstractServer:
    """A unix-socket server on `path`, mode 0600 from its first moment (the umask; no window to connect)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    old = os.umask(0o177)
    try:
        server = await asyncio.start_unix_server(handle, path=str(path))
    finally:
        os.umask(old)
    os.chmod(path, SOCKET_MODE)
    return server


async def _serve(path: Path, handle: Handler, on_stop: Callable[[], None] = lambda: None) -> None:
    """Serve `handle` on `path` until SIGTERM or SIGINT; then remove the socket."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await _listen(path, handle)
    log.info("listening on %s (mode %o)", path, SOCKET_MODE)
    try:
        await stop.wait()
    finally:
        server.close()
        path.unlink(missing_ok=True)
        on_stop()


# -- mongo ------------------------------------------------------------------------------------


def serve_mongo(path: Path, *, db: str = "", data_dir: str = "") -> None:
    from nx_27017.handler import NeoSQLiteHandler
    from nx_27017.server import handle_client

    handler = NeoSQLiteHandler(db or ":memory:", data_dir=data_dir or None)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await handle_client(reader, writer, handler)

    asyncio.run(_serve(path, handle))


# -- logstore ---------------------------------------------------------------------------------


def _lo_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def private_network() -> str:
    """Move this process into a network namespace of its own with loopback up (as root: a plain one;
    else inside a user namespace mapping only our own uid and gid). "" when done, else why not."""
    uid, gid = os.getuid(), os.getgid()
    try:
        if os.geteuid() == 0:
            _unshare(_CLONE_NEWNET)
        else:
            _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        _lo_up()
    except OSError as e:
        return f"the kernel refused a private network namespace ({e})"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


def _bridge(port: int) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as e:
            log.warning("the log store on port %d does not answer: %s", port, e)
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer), return_exceptions=True)
        for w in (writer, up_writer):
            w.close()
    return handle


def _wait_listening(proc: subprocess.Popen, port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"osmem-server exited with {proc.returncode} before listening")
        with socket.socket() as s, contextlib.suppress(OSError):
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"osmem-server did not listen on port {port} within {timeout:.0f}s")


def serve_logstore(path: Path, binary: str) -> None:
    why_not = private_network()
    port = _free_port() if why_not else INNER_PORT
    if why_not:
        log.warning("%s: the log store also listens on 127.0.0.1:%d, where any local process reaches it", why_not,
                    port)
    # it exits when this process does (--parent-pid), even if this one is SIGKILLed
    proc = subprocess.Popen([binary, "--addr", f"127.0.0.1:{port}", "--no-stdin-watch", "--parent-pid",
                             str(os.getpid())], stdin=subprocess.DEVNULL)
    _wait_listening(proc, port)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    asyncio.run(_serve(path, _bridge(port), stop))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="storesock", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="store", required=True)
    m = sub.add_parser("mongo")
    m.add_argument("--socket", type=Path, required=True)
    m.add_argument("--db", default="", help="one SQLite file for every database")
    m.add_argument("--data-dir", default="", help="a directory: one SQLite file per database")
    m.add_argument("--log-file", default="")
    ls = sub.add_parser("logstore")
    ls.add_argument("--socket", type=Path, required=True)
    ls.add_argument("--binary", required=True, help="the osmem-server binary")
    ls.add_argument("--log-file", default="")
    args = p.parse_args(argv)
    logging.basicConfig(filename=args.log_file or None, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.store == "mongo":
        serve_mongo(args.socket, db=args.db, data_dir=args.data_dir)
    else:
        serve_logstore(args.socket, args.binary)


if __name__ == "__main__":
    main()

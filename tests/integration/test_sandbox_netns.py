"""The job's network namespace made, addressed and removed in-process (no `ip` exec), with `ip` as the fallback.

Real namespaces, checked with `ip` itself: what the in-process path makes
must be what `ip netns add` + `ip -n <ns> link set lo up` made (listed by
`ip netns`, loopback up, nothing else), the controller's own threads must
stay in the host's namespace, and a failing in-process path must fall back
to `ip` (and name both when both fail).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from trainforge_services.common import isolation
from trainforge_services.controller.sandbox import netns, userns

needs_root_netns = pytest.mark.skipif(os.geteuid() != 0 or bool(isolation.unavailable()),
                                      reason=f"no root sandbox here: {isolation.unavailable() or 'not root'}")


@pytest.fixture
def job():
    job_id = f"nstest-{uuid.uuid4().hex[:8]}"
    yield job_id
    isolation.remove_netns(job_id)
    assert not netns.path_of(job_id).exists()


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True, timeout=10).stdout


def listed(job_id: str) -> bool:
    return isolation.netns_name(job_id) in ip("netns", "list").split()


@needs_root_netns
def test_ensure_makes_what_ip_would_without_running_it(job, monkeypatch):
    def no_ip(*args: str) -> None:
        raise AssertionError(f"ip {args} was run")

    monkeypatch.setattr(netns, "_ip", no_ip)
    host_ns = os.stat("/proc/thread-self/ns/net").st_ino
    path = netns.ensure(job)
    assert path == netns.path_of(job) and listed(job)
    links = ip("-n", isolation.netns_name(job), "-o", "link", "show")
    assert links.count("\n") == 1 and "lo:" in links and "UP" in links  # loopback only, and up
    assert os.stat(path).st_ino != host_ns
    assert os.stat("/proc/thread-self/ns/net").st_ino == host_ns  # the caller never left the host's namespace
    assert netns.ensure(job) == path  # a second rank joins it
    assert isolation.remove_netns(job) and not path.exists() and not listed(job)


@needs_root_netns
def test_ip_makes_it_when_the_in_process_path_fails(job, monkeypatch):
    def refused(path):  # noqa: ANN001, ANN202
        raise OSError(1, "refused for the test")

    monkeypatch.setattr(netns, "create", refused)
    path = netns.ensure(job)
    assert listed(job) and "UP" in ip("-n", isolation.netns_name(job), "-o", "link", "show", "lo")
    assert isolation.remove_netns(job) and not path.exists()


@needs_root_netns
def test_both_failing_names_both(job, monkeypatch):
    def refused(path):  # noqa: ANN001, ANN202
        raise OSError(1, "refused for the test")

    monkeypatch.setattr(netns, "create", refused)
    monkeypatch.setenv("PATH", "/nonexistent")  # no `ip` either
    with pytest.raises(OSError, match=r"in-process: .*refused for the test.*; with ip: "):
        netns.ensure(job)
    assert not netns.path_of(job).exists()


@needs_root_netns
def test_a_failed_in_process_create_leaves_nothing_behind(job, monkeypatch):
    def broken() -> None:
        raise OSError(1, "lo refused for the test")

    monkeypatch.setattr(netns, "lo_up", broken)
    with pytest.raises(OSError, match="lo refused"):
        netns.create(netns.path_of(job))
    assert not netns.path_of(job).exists() and not listed(job)


@needs_root_netns
def test_an_address_goes_on_the_namespaces_loopback_once(job, monkeypatch):
    path = netns.ensure(job)
    name = isolation.netns_name(job)
    monkeypatch.setattr(subprocess, "run", None)  # the in-process path only: no `ip` fallback possible
    netns.add_address(path, name, "10.254.3.4")
    netns.add_address(path, name, "10.254.3.4")  # already there: fine, as `ip`'s "exists"
    netns.add_address(path, name, "127.0.0.1")  # loopback: nothing to add
    monkeypatch.undo()
    shown = ip("-n", name, "-o", "-4", "addr", "show", "dev", "lo")
    assert "10.254.3.4/32 scope global lo" in shown and shown.count("10.254.3.4") == 1
    assert "10.254.3.4" not in ip("-o", "-4", "addr", "show")  # not on the host's


@needs_root_netns
def test_an_address_falls_back_to_ip(job, monkeypatch):
    path = netns.ensure(job)
    name = isolation.netns_name(job)

    def refused(addr: str) -> None:
        raise OSError(1, "rtnetlink refused for the test")

    monkeypatch.setattr(netns, "add_loopback_address", refused)
    netns.add_address(path, name, "10.254.3.5")
    assert "10.254.3.5/32" in ip("-n", name, "-o", "-4", "addr", "show", "dev", "lo")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(OSError, match=r"in-process: .*rtnetlink refused.*; with ip: "):
        netns.add_address(path, name, "10.254.3.6")


@needs_root_netns
def test_remove_falls_back_to_ip(job, monkeypatch):
    netns.ensure(job)

    def refused(path):  # noqa: ANN001, ANN202
        raise OSError(1, "umount refused for the test")

    monkeypatch.setattr(isolation, "_unmount_netns", refused)
    assert isolation.remove_netns(job) and not listed(job)


def test_the_user_namespace_functions_work_inside_a_namespace_of_its_own():
    """lo_up and add_loopback_address as `userns.py listen` uses them: in a user + network
    namespace the process made itself (no `ip` on its PATH)."""
    script = ("import sys, socket; sys.path.insert(0, sys.argv[1]); import userns; userns.lo_up(); "
              "userns.add_loopback_address('10.254.7.8'); userns.add_loopback_address('10.254.7.8'); "
              "s = socket.socket(); s.bind(('10.254.7.8', 0)); s.listen(); print('bound', s.getsockname()[0])")
    out = subprocess.run([shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--net", sys.executable, "-I", "-S", "-c", script,
                          os.path.dirname(userns.__file__)], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/nonexistent"}, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "bound 10.254.7.8"

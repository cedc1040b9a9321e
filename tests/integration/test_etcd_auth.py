"""etcd with authentication on (the real etcd): the services' users, each job's own user, and its revocation."""

from __future__ import annotations

import contextlib
import queue
import secrets
import threading
from types import SimpleNamespace

import pytest

from trainforge_services.common import jobcreds
from trainforge_services.common.adapters import etcdauth
from trainforge_services.common.adapters.etcd import Coordinator, StopEvent
from trainforge_services.common.errors import PermissionDenied, Unauthenticated
from trainforge_services.lcm.lifecycle.etcd_users import ENV_PASSWORD, ENV_USER, EtcdIssuer


@pytest.fixture
def root(etcd_auth_server, unique):
    c = Coordinator(etcd_auth_server.address, f"/tf-{unique}", user=etcdauth.ROOT,
                    password=etcd_auth_server.extra["root_password"])
    yield c
    c.close()


@pytest.fixture
def connect(etcd_auth_server, root):
    """connect(user, password): a connection under the test's prefix, closed after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda user, password: stack.enter_context(contextlib.closing(
            Coordinator(etcd_auth_server.address, root.keys.prefix, user=user, password=password)))


@pytest.fixture
def issuer(root):
    return EtcdIssuer(root, secrets.token_urlsafe(32).encode())


def job_login(issuer: EtcdIssuer, connect, job: str) -> tuple[Coordinator, dict]:
    env = issuer.grant(SimpleNamespace(job_id=job)).controller
    return connect(env[ENV_USER], env[ENV_PASSWORD]), env


def first_events(coord: Coordinator, prefix: str, n: int, **kw) -> tuple[StopEvent, queue.Queue]:
    """A watch of `prefix` on a thread: its events (or the error it raised) on the queue."""
    stop, q = StopEvent(), queue.Queue()

    def run() -> None:
        try:
            for event in coord.watch_prefix(prefix, stop=stop, **kw):
                q.put(event)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            q.put(e)

    threading.Thread(target=run, daemon=True).start()
    return stop, q


def test_a_job_user_reads_writes_leases_and_watches_its_own_keys(issuer, root, connect):
    keys = root.keys
    job, env = job_login(issuer, connect, "j1")
    assert env[ENV_USER] == etcdauth.principal(keys.prefix, "job-j1")
    assert env[ENV_PASSWORD] == issuer.password("j1") != issuer.password("j2")
    grant = issuer.grant(SimpleNamespace(job_id="j1"))
    assert grant.monitor == grant.controller and {ENV_USER, ENV_PASSWORD} <= set(grant.withheld)

    stop, events = first_events(job, keys.learners("j1"), 2)
    try:
        assert events.get(timeout=20).kind == "resync"
        lease = job.grant_lease(5)  # leases need no key permission
        job.put(keys.learner_status("j1", 0), {"state": 1}, lease=lease)
        assert lease.refresh()
        event = events.get(timeout=20)
        assert (event.kind, event.key, event.value) == ("put", keys.learner_status("j1", 0), {"state": 1})
    finally:
        stop.set()
    assert job.create(keys.monitor("j1"), {"pid": 1}, lease=lease)
    assert job.get(keys.halt("j1")) == (None, 0)
    job.put(keys.learner_halted("j1", 0), {"attempt": 1})
    job.put(keys.logship("j1", 0), {"attempt": 1, "archived": 0, "shipped": 0})
    assert set(job.list(keys.job("j1"))[0]) == {keys.learner_status("j1", 0), keys.monitor("j1"),
                                                keys.learner_halted("j1", 0), keys.logship("j1", 0)}
    assert root.get(keys.monitor("j1"))[0] == {"pid": 1}  # what the LCM sees


@pytest.mark.parametrize("key", ["attempt-of-j2", "halt-of-j2", "leader", "killed", "root", "outside"])
def test_a_job_user_is_refused_everything_else(issuer, root, connect, key):
    keys = root.keys
    target = {"attempt-of-j2": keys.attempt("j2"), "halt-of-j2": keys.halt("j2"), "leader": keys.leader("lcm"),
              "killed": keys.killed("j1"), "root": "/", "outside": "/elsewhere/jobs/j1/halt"}[key]
    root.put(keys.attempt("j2"), {"attempt": 1})
    job, env = job_login(issuer, connect, "j1")
    for attempt in (lambda: job.get(target), lambda: job.put(target, {"x": 1}), lambda: job.list(target),
                    lambda: job.delete(target), lambda: job.create(target, {"x": 1})):
        with pytest.raises(PermissionDenied) as refused:
            attempt()
        assert env[ENV_USER] in str(refused.value) and "permission denied" in str(refused.value)
        assert env[ENV_PASSWORD] not in str(refused.value)
    assert root.get(keys.attempt("j2"))[0] == {"attempt": 1}


def test_a_watch_of_another_jobs_keys_is_refused_not_silent(issuer, root, connect):
    job, env = job_login(issuer, connect, "j1")
    for start in (None, 1):  # with a listing first, and straight from a revision
        stop, events = first_events(job, root.keys.learners("j2"), 1, start_revision=start)
        try:
            error = events.get(timeout=20)
        finally:
            stop.set()
        assert isinstance(error, PermissionDenied) and env[ENV_USER] in str(error)


def test_a_revoked_job_user_is_refused_even_with_a_token_it_holds(issuer, root, connect):
    keys = root.keys
    job, env = job_login(issuer, connect, "j1")
    job.put(keys.halt("j1"), {"attempt": 1})
    issuer.revoke("j1")
    issuer.revoke("j1")  # again: nothing left, no error
    with pytest.raises(Unauthenticated) as refused:
        job.get(keys.halt("j1"))
    assert env[ENV_USER] in str(refused.value) and env[ENV_PASSWORD] not in str(refused.value)
    with pytest.raises(Unauthenticated):  # the finished job's credentials, used afresh
        connect(env[ENV_USER], env[ENV_PASSWORD]).login()
    # a later attempt of the job gets its user again
    again, _ = job_login(issuer, connect, "j1")
    assert again.get(keys.halt("j1"))[0] == {"attempt": 1}


def test_a_refused_login_names_the_user_never_the_password(root, connect):
    with pytest.raises(Unauthenticated) as refused:
        connect("nobody-here", "not-the-password").get(root.keys.halt("j1"))
    assert "'nobody-here'" in str(refused.value) and "not-the-password" not in str(refused.value)
    with pytest.raises(Unauthenticated, match="authentication on: set etcd_user"):
        connect("", "").get(root.keys.halt("j1"))
    with pytest.raises(ValueError, match="must be given together"):
        connect("someone", "")


def test_services_get_their_own_users_and_a_lapsed_token_is_renewed(root, connect, etcd_auth_server):
    keys, admin = root.keys, root.admin()
    trainer = etcdauth.ServiceUser(etcdauth.principal(keys.prefix, "trainer"), secrets.token_urlsafe(16),
                                   (f"{keys.prefix}/leaders/",))
    lcm = etcdauth.ServiceUser(etcdauth.principal(keys.prefix, "lcm"), secrets.token_urlsafe(16), root=True)
    for _ in range(2):  # idempotent
        etcdauth.setup(admin, etcd_auth_server.extra["root_password"], [trainer, lcm], enabled=True)
    as_trainer, as_lcm = connect(trainer.user, trainer.password), connect(lcm.user, lcm.password)
    assert as_trainer.login() and as_trainer.create(keys.leader("trainer"), {"holder": "t"})
    with pytest.raises(PermissionDenied):
        as_trainer.put(keys.halt("j1"), {"attempt": 1})
    # the LCM's user mints job users
    job, _ = job_login(EtcdIssuer(as_lcm, b"k" * 32), connect, "j1")
    job.put(keys.halt("j1"), {"attempt": 1})
    # setting a password (the same one) ends the user's tokens: the next call logs in again
    generation = as_trainer.session.generation
    admin.ensure_user(trainer.user, trainer.password)
    assert as_trainer.get(keys.leader("trainer"))[0] == {"holder": "t"}
    assert as_trainer.session.generation == generation + 1
    stop, events = first_events(as_trainer, f"{keys.prefix}/leaders/", 1)
    try:
        assert events.get(timeout=20).kind == "resync"
        admin.ensure_user(trainer.user, trainer.password)
        as_trainer.put(keys.leader("trainer"), {"holder": "u"})  # renews; the open watch goes on
        event = events.get(timeout=20)
        assert (event.kind, event.value) == ("put", {"holder": "u"})
    finally:
        stop.set()


def test_job_passwords_are_derived_from_the_credentials_key(root):
    key = secrets.token_urlsafe(32).encode()
    assert EtcdIssuer(root, key).password("j1") == jobcreds.derive(key, "etcd", "j1")


def test_the_setup_command_turns_auth_on_once_and_again_harmlessly(capsys):
    from tests import servers
    from trainforge_services.lcm import etcd_setup

    etcd = servers.start_etcd()
    try:
        env = {"TF_ETCD_ENDPOINTS": etcd.address, "TF_ETCD_PREFIX": "/tf", "TF_ETCD_ROOT_PASSWORD": "root-pw-1",
               "TF_ETCD_TRAINER_USER": "tf-trainer", "TF_ETCD_TRAINER_PASSWORD": "trainer-pw",
               "TF_ETCD_LCM_USER": "tf-lcm", "TF_ETCD_LCM_PASSWORD": "lcm-pw"}
        assert etcd_setup.main({**env, "TF_ETCD_LCM_PASSWORD": ""}) == 2
        assert "TF_ETCD_LCM_PASSWORD" in capsys.readouterr().err
        assert etcd_setup.main(env) == 0
        plain = Coordinator(etcd.address, "/tf")
        with pytest.raises(Unauthenticated):
            plain.get("/tf/jobs/j1/halt")
        plain.close()
        assert etcd_setup.main({**env, "TF_ETCD_LCM_PASSWORD": "lcm-pw-2"}) == 0  # again: a new password
        lcm = Coordinator(etcd.address, "/tf", user="tf-lcm", password="lcm-pw-2")
        assert lcm.login() and lcm.get("/tf/jobs/j1/halt") == (None, 0)
        lcm.close()
        assert etcd_setup.main({**env, "TF_ETCD_ROOT_PASSWORD": "wrong"}) == 1
        err = capsys.readouterr().err
        assert "'root'" in err and "wrong" not in err.replace("wrong password", "")
    finally:
        etcd.cleanup()

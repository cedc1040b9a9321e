"""The one retry/backoff helper: delays, give-up rules, stop events."""

from __future__ import annotations

import threading

import pytest

from trainforge_services.common.retry import Backoff, Stopped, retry_call


def test_backoff_doubles_up_to_the_cap_and_resets():
    b = Backoff(0.1, 1.0)
    assert [round(b.next(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert b.failures == 6
    b.reset()
    assert b.next() == pytest.approx(0.1)


def test_backoff_rejects_nonsense():
    with pytest.raises(ValueError, match="initial"):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError):
        Backoff(2.0, 1.0)


def test_retry_call_retries_only_the_named_errors():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("down")
        return "ok"

    seen = []
    assert retry_call(flaky, retry_on=ConnectionError, attempts=5, initial=0.001,
                      on_retry=lambda e, n, d: seen.append((type(e), n))) == "ok"
    assert seen == [(ConnectionError, 1), (ConnectionError, 2)]
    with pytest.raises(KeyError):
        retry_call(lambda: {}["x"], retry_on=ConnectionError, attempts=5, initial=0.001)


def test_retry_call_gives_up_with_the_last_error():
    calls = []

    def down():
        calls.append(1)
        raise ConnectionError(f"try {len(calls)}")

    with pytest.raises(ConnectionError, match="try 3"):
        retry_call(down, retry_on=ConnectionError, attempts=3, initial=0.001)
    calls.clear()
    with pytest.raises(ConnectionError):
        retry_call(down, retry_on=ConnectionError, deadline=0.05, initial=0.01, maximum=0.01)
    assert 2 <= len(calls) <= 10


def test_retry_call_stops_when_the_event_is_set_during_a_wait():
    stop = threading.Event()

    def down():
        threading.Timer(0.05, stop.set).start()
        raise ConnectionError("down")

    with pytest.raises(Stopped):
        retry_call(down, retry_on=ConnectionError, initial=30.0, maximum=30.0, stop_event=stop)


def test_retry_call_with_the_event_already_set_raises_the_error_at_once():
    stop = threading.Event()
    stop.set()
    with pytest.raises(ConnectionError):
        retry_call(lambda: (_ for _ in ()).throw(ConnectionError("down")), retry_on=ConnectionError,
                   initial=30.0, stop_event=stop)


def test_named_policies_keep_their_shape_from_another_first_delay_and_bound_a_call():
    from trainforge_services.common.retry import PATIENT, QUICK, STEADY

    assert QUICK.initial < STEADY.initial < PATIENT.initial
    faster = STEADY.starting(0.01)
    assert (faster.initial, faster.maximum) == (0.01, 0.01 * STEADY.maximum / STEADY.initial)
    assert faster.name == "steady"
    calls: list[int] = []

    def flaky():
        calls.append(1)
        raise ConnectionError("away")

    with pytest.raises(ConnectionError):
        QUICK.starting(0.001).within(attempts=3).call(flaky, retry_on=ConnectionError)
    assert len(calls) == 3
    assert QUICK.backoff().next() == QUICK.initial

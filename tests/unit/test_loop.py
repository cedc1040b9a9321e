"""The background-loop helper every service uses: it runs, wakes, paces, survives a failing step and stops."""

from __future__ import annotations

import threading
import time

import pytest

from trainforge_services.common.errors import Unavailable, message_of
from trainforge_services.common.loop import Loop


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_loop_runs_at_start_and_again_when_woken_long_before_its_interval():
    runs: list[float] = []
    loop = Loop("t-wake", lambda: runs.append(time.monotonic()), interval=60.0)
    loop.start()
    wait_for(lambda: len(runs) == 1)
    loop.wake()
    wait_for(lambda: len(runs) == 2)
    assert loop.stop(timeout=5.0)


def test_an_event_handed_in_wakes_the_loop_when_set():
    runs: list[int] = []
    event = threading.Event()
    loop = Loop("t-wake-on", lambda: runs.append(1), interval=60.0, wake_on=event)
    loop.start()
    wait_for(lambda: len(runs) == 1)
    event.set()
    wait_for(lambda: len(runs) == 2)
    assert loop.stop(timeout=5.0)


def test_a_loop_runs_every_interval_without_a_wake():
    runs: list[int] = []
    loop = Loop("t-interval", lambda: runs.append(1), interval=0.02)
    loop.start()
    wait_for(lambda: len(runs) >= 4)
    assert loop.stop(timeout=5.0)


def test_a_failing_step_is_logged_and_the_loop_goes_on(caplog):
    calls: list[int] = []

    def step():
        calls.append(1)
        if len(calls) == 1:
            raise Unavailable("the store is away")
        if len(calls) == 2:
            raise RuntimeError("a bug")

    loop = Loop("t-fail", step, interval=0.01)
    loop.start()
    wait_for(lambda: len(calls) >= 3)
    assert loop.stop(timeout=5.0)
    assert "t-fail: the store is away" in caplog.text
    assert "t-fail: the step failed unexpectedly" in caplog.text


def test_a_step_that_returns_seconds_runs_again_that_soon():
    runs: list[int] = []
    loop = Loop("t-sooner", lambda: runs.append(1) or 0.01, interval=60.0)
    loop.start()
    wait_for(lambda: len(runs) >= 3)
    assert loop.stop(timeout=5.0)


def test_a_loop_skips_its_step_while_when_says_no():
    leading = threading.Event()
    runs: list[int] = []
    asked: list[int] = []

    def when() -> bool:
        asked.append(1)
        return leading.is_set()

    loop = Loop("t-when", lambda: runs.append(1), interval=0.01, when=when)
    loop.start()
    wait_for(lambda: len(asked) >= 5)  # asked five times while a follower: no run
    assert not runs
    leading.set()
    wait_for(lambda: len(runs) >= 1)
    assert loop.stop(timeout=5.0)


def test_spacing_keeps_an_expensive_step_from_running_back_to_back():
    starts: list[float] = []

    def step():
        starts.append(time.monotonic())
        time.sleep(0.05)

    loop = Loop("t-spacing", step, interval=0.001, spacing=(0.0, 1.0))
    loop.start()
    wait_for(lambda: len(starts) >= 3)
    assert loop.stop(timeout=5.0)
    # each run waits twice the last one's duration (0.05 s) after it began
    assert all(b - a >= 0.095 for a, b in zip(starts, starts[1:], strict=False))


def test_stop_waits_for_the_running_step_and_no_step_runs_after():
    inside, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def step():
        runs.append(1)
        inside.set()
        release.wait(5.0)

    loop = Loop("t-stop", step, interval=0.01)
    loop.start()
    assert inside.wait(5.0)
    ended: list[bool] = []
    stopper = threading.Thread(target=lambda: ended.append(loop.stop(timeout=5.0)))
    stopper.start()
    release.set()
    stopper.join(5.0)
    assert ended == [True]  # stop returned once the running step did, and the loop's thread has ended
    loop.wake()  # nothing is left to run it
    assert runs == [1]


def test_bad_settings_are_refused_naming_the_loop():
    with pytest.raises(ValueError, match="loop x: interval"):
        Loop("x", lambda: None, interval=0)
    with pytest.raises(ValueError, match="loop y: spacing"):
        Loop("y", lambda: None, interval=1, spacing=(2.0, 1.0))


def test_message_of_prefers_the_domain_message_then_the_text_then_the_type():
    assert message_of(Unavailable("etcd is away")) == "etcd is away"
    assert message_of(ValueError("bad")) == "bad"
    assert message_of(TimeoutError()) == "TimeoutError"


def test_a_loop_started_not_at_once_first_runs_after_one_interval_or_a_wake():
    runs: list[float] = []
    loop = Loop("t-later", lambda: runs.append(time.monotonic()), interval=0.1)
    started = time.monotonic()
    loop.start(at_once=False)
    wait_for(lambda: len(runs) >= 1)
    assert runs[0] - started >= 0.09
    assert loop.stop(timeout=5.0)
    woken = Loop("t-woken", lambda: runs.append(time.monotonic()), interval=60.0)
    woken.start(at_once=False)
    woken.wake()
    wait_for(lambda: len(runs) >= 2)
    assert woken.stop(timeout=5.0)

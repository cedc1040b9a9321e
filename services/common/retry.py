"""Retrying and backing off, one way for the whole platform (built on tenacity).

Two shapes cover every loop in the services:

* `retry_call(fn, ...)` calls `fn` until it returns, retrying the errors it
  is told to retry with capped exponential backoff, until an attempt count,
  a deadline or a stop event ends it (then the last error is raised).
* `Backoff` is the delay sequence alone, for loops that wait on an event
  rather than sleep (a publisher woken by new work, a shipper that must
  notice shutdown): `delay = backoff.next()`, and `reset()` after a success.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import tenacity

T = TypeVar("T")


class Backoff:
    """Capped exponential delays: initial, initial*factor, ... up to maximum."""

    def __init__(self, initial: float = 0.1, maximum: float = 5.0, factor: float = 2.0):
        if initial <= 0 or maximum < initial or factor < 1:
            raise ValueError(f"backoff needs 0 < initial <= maximum and factor >= 1, got {initial}, {maximum}, "
                             f"{factor}")
        self.initial, self.maximum, self.factor = initial, maximum, factor
        self._wait = tenacity.wait_exponential(multiplier=initial, exp_base=factor, max=maximum)
        self._failures = 0

    @property
    def failures(self) -> int:
        """Delays handed out since the last reset: consecutive failures."""
        return self._failures

    def next(self) -> float:
        self._failures += 1
        state = tenacity.RetryCallState(None, None, (), {})
        state.attempt_number = self._failures
        # tenacity's exponential wait counts from attempt 1 as multiplier * base**0
        return max(self.initial, min(self.maximum, self._wait(state)))

    def reset(self) -> None:
        self._failures = 0


class Stopped(Exception):
    """`retry_call` gave up because its stop event was set."""


def retry_call(fn: Callable[[], T], *, retry_on: type[BaseException] | tuple[type[BaseException], ...],
               attempts: int | None = None, deadline: float | None = None, initial: float = 0.1,
               maximum: float = 5.0, stop_event: threading.Event | None = None,
               on_retry: Callable[[BaseException, int, float], None] | None = None) -> T:
    """`fn()`, retried on `retry_on` errors with capped exponential backoff.

    Ends after `attempts` calls, or when the next wait would pass `deadline`
    (seconds from now), raising the last error; a `stop_event` set before a
    retry ends it the same way, and one set during a wait raises `Stopped`. `on_retry(error, attempt, delay)` is called before
    each wait, e.g. to log.
    """
    stops: list[tenacity.stop.stop_base] = []
    if attempts is not None:
        stops.append(tenacity.stop_after_attempt(attempts))
    if deadline is not None:
        stops.append(tenacity.stop_before_delay(deadline))
    if stop_event is not None:
        stops.append(lambda _state: stop_event.is_set())

    def sleep(seconds: float) -> None:
        if stop_event is None:
            time.sleep(seconds)
        elif stop_event.wait(seconds):
            raise Stopped()

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None and state.next_action is not None:
            on_retry(state.outcome.exception(), state.attempt_number, state.next_action.sleep)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(retry_on),
        wait=tenacity.wait_exponential(multiplier=initial, max=maximum),
        stop=tenacity.stop_any(*stops) if stops else tenacity.stop_never,
        sleep=sleep, before_sleep=before_sleep, reraise=True)
    return retrying(fn)


@dataclasses.dataclass(frozen=True)
class Policy:
    """A named way to retry: the first delay and the cap, and optionally how many attempts or how many seconds in
    all. Call sites choose one of the policies below rather than picking their own delays; a site whose first
    delay is a setting (a test runs it faster) keeps the policy's shape with `starting(initial)`."""

    name: str
    initial: float
    maximum: float
    attempts: int | None = None
    deadline: float | None = None

    def starting(self, initial: float) -> Policy:
        """This policy from another first delay, its cap scaled alike (never below the new first delay)."""
        ratio = self.maximum / self.initial
        return dataclasses.replace(self, initial=initial, maximum=max(initial, initial * ratio))

    def within(self, *, attempts: int | None = None, deadline: float | None = None) -> Policy:
        """This policy bounded by an attempt count or a deadline (seconds) of the caller's."""
        return dataclasses.replace(self, attempts=attempts if attempts is not None else self.attempts,
                                   deadline=deadline if deadline is not None else self.deadline)

    def backoff(self) -> Backoff:
        return Backoff(self.initial, self.maximum)

    def call(self, fn: Callable[[], T], *, retry_on: type[BaseException] | tuple[type[BaseException], ...],
             stop_event: threading.Event | None = None,
             on_retry: Callable[[BaseException, int, float], None] | None = None) -> T:
        return retry_call(fn, retry_on=retry_on, attempts=self.attempts, deadline=self.deadline,
                          initial=self.initial, maximum=self.maximum, stop_event=stop_event, on_retry=on_retry)


# A store or coordinator on this machine or the next (etcd, MongoDB, the Kubernetes API) that is briefly away:
# a leader election, a connection being re-made. Retried soon and often.
QUICK = Policy("quick", initial=0.05, maximum=1.0)
# The default for a platform peer over the network (the LCM, the log store, etcd from a learner).
STEADY = Policy("steady", initial=0.1, maximum=5.0)
# Something slow to come back, where retrying hard only adds load: a container engine.
PATIENT = Policy("patient", initial=1.0, maximum=30.0)
# A delivery kept in an outbox and tried again over minutes, each try counted against its own limit (the
# Trainer's webhook POSTs): a receiver may be down for a while, and its tries should spread over that while
# rather than be spent in the first minute. The first delay is the Trainer's `webhook_backoff` setting.
DELIVERY = Policy("delivery", initial=1.0, maximum=300.0)
# The job monitor's waits on the Trainer and etcd (a state report that nothing may overtake, its claim on the job):
# from its `report_retry_seconds` setting up to 8 times it, so a Trainer that is back hears the state within seconds.
REPORT = Policy("report", initial=1.0, maximum=8.0)

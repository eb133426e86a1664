"""Riding out storage and broker trouble inside an invocation.

A failed invocation is not free: on a Storage queue it spends one of the
``maxDequeueCount`` (5) deliveries, and the next comes after ``visibilityTimeout``;
on Service Bus the host abandons the message and it is back at once, so five
failures in a few seconds dead-letter it. Either way a storage outage of a minute
would move good orders to a poison queue. So the triggers retry the work here, with
growing waits, while the failure is one that waiting can cure (``StorageUnavailable``,
``ConcurrencyConflict``), for up to ``RIDE_OUT_SECONDS``; only then does the host get
the failure back. Every use case behind a trigger is idempotent (conditional writes,
fenced replies), so running it again is safe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from config.settings import DEFAULT_RIDE_OUT_SECONDS
from core.errors import ConcurrencyConflict, StorageUnavailable
from messaging import bound
from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)


#: Two minutes of trouble inside one invocation; with maxDequeueCount 5 that is about
#: ten minutes before a message is given up on (``Settings.ride_out_seconds``, which
#: tests shorten with ORDERS_RIDE_OUT_SECONDS).
RIDE_OUT_SECONDS: Final = DEFAULT_RIDE_OUT_SECONDS


def ride_out[T](
    work: Callable[[], T],
    *,
    what: str,
    seconds: float | None = None,
    max_wait: float = 10,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``work``; while it fails with a retryable storage error, wait and run it again."""

    def note(state: RetryCallState) -> None:
        bound.release()  # what the invocation decided leaves now, not after the wait
        METRICS.inc("ride_out_retries", what=what)
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "%s failed (try %d), retrying within the invocation: %s",
            what,
            state.attempt_number,
            error,
        )

    budget = RIDE_OUT_SECONDS if seconds is None else seconds

    def spent(state: RetryCallState) -> bool:
        # Real time, or the time the (injectable) sleep spent: with a fake sleep real time
        # hardly passes, and a budget in real time alone would never run out.
        return max(state.seconds_since_start or 0.0, state.idle_for) >= budget

    for attempt in Retrying(
        retry=retry_if_exception_type((StorageUnavailable, ConcurrencyConflict)),
        stop=spent,
        wait=wait_exponential_jitter(multiplier=0.5, max=max_wait),
        sleep=sleep,
        before_sleep=note,
        reraise=True,
    ):
        with attempt:
            return work()
    raise AssertionError("unreachable")  # pragma: no cover

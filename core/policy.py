"""When a step that failed or was deferred may run again, and when it gives up.

Retries are paced in time, not only counted (docs/contracts.md §3.11):

- After a failure the agent saw at the remote (no answer, a 5xx, a lost connection, a
  409), the next attempt waits ``paced(k)``: about 1, 2, 4 ... s, jittered, capped.
- After an expiry with no report at all (a lost message, a killed instance) it may
  start again at once, up to ``soft_threshold`` such expiries in a row (``backoff``).
- Whatever the delays, the (k+1)-th attempt since the failure count was last reset
  does not start before ``k`` step timeouts after the first one began
  (``budget_floor``), and the count's last failure is not final before
  ``MAX_FAILURE_COUNT`` timeouts have passed: a remote that stalls for less than
  that cannot spend a step's whole budget.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class RetryPolicy:
    """Supervisor retries: deterministic (jitter derived from the order id), so tests can
    assert exact times, and orders that failed together (an outage) do not all come
    back in the same second."""

    max_failure_count: int = 5
    #: Expiries with no report (no evidence the remote was even reached) retry at once
    #: up to this many counted failures; later ones wait ``base * 2^k``.
    soft_threshold: int = 2
    base_backoff_seconds: float = 1.0
    max_backoff_seconds: float = 300.0
    #: Deferrals (the remote not called, or down for everyone) do not count as failures;
    #: they wait 1, 2, 4 ... s (at least until the time the agent asked for), capped
    #: low so that orders resume within seconds of the remote's return, for at most
    #: ``deferral_window_seconds`` in a row before the step fails for good.
    deferral_window_seconds: float = 1800.0
    base_deferral_seconds: float = 1.0
    max_deferral_seconds: float = 10.0
    #: How far apart two instances' clocks may be (``MAX_CLOCK_SKEW_SECONDS``). A decision
    #: to undo never rests on one instance's clock against another's deadline: an attempt
    #: is taken to reach until its deadline plus this (``core.attempts.Attempt.reach``).
    clock_skew_seconds: float = 10.0

    @property
    def skew(self) -> timedelta:
        return timedelta(seconds=self.clock_skew_seconds)

    def backoff(self, failure_count: int, order_id: str = "") -> timedelta:
        """After an expiry with no report: at once up to the soft threshold, then growing."""
        if failure_count <= self.soft_threshold:
            return timedelta(0)
        exponent = failure_count - self.soft_threshold - 1
        return _grow(
            self.base_backoff_seconds,
            exponent,
            self.max_backoff_seconds,
            f"{order_id}:{failure_count}",
        )

    def paced(self, failure_count: int, order_id: str = "") -> timedelta:
        """After a failure the agent saw at the remote: about 1, 2, 4 ... s, capped."""
        return _grow(
            self.base_backoff_seconds,
            failure_count - 1,
            self.max_backoff_seconds,
            f"{order_id}:paced:{failure_count}",
        )

    def deferral_delay(self, deferrals: int, order_id: str = "") -> timedelta:
        """How long the ``deferrals``-th deferral in a row waits at least."""
        return _grow(
            self.base_deferral_seconds,
            deferrals - 1,
            self.max_deferral_seconds,
            f"{order_id}:deferral:{deferrals}",
        )

    @staticmethod
    def budget_floor(since: datetime, failures: int, timeout_seconds: int) -> datetime:
        """The earliest time the attempt after ``failures`` counted failures may start (and,
        for ``max_failure_count``, the earliest time the step may give up): ``failures``
        step timeouts after the first attempt of the budget began."""
        return since + timedelta(seconds=timeout_seconds * failures)

    @property
    def deferral_window(self) -> timedelta:
        return timedelta(seconds=self.deferral_window_seconds)

    def gives_up(self, failure_count: int) -> bool:
        return failure_count >= self.max_failure_count


def _grow(base: float, exponent: int, cap: float, salt: str) -> timedelta:
    """``base * 2**exponent``, +/-20% jitter derived from ``salt``, capped after jitter."""
    exponent = min(max(exponent, 0), 30)  # 2**30 s is past any cap
    digest = hashlib.sha256(salt.encode()).digest()
    jitter = 0.8 + 0.4 * (digest[0] / 255)  # 0.8 .. 1.2
    return timedelta(seconds=round(min(base * 2**exponent * jitter, cap), 3))

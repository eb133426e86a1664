"""When a step that failed or was deferred may run again, and when it gives up."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class RetryPolicy:
    """Supervisor retries: immediate up to a soft threshold, then growing backoff.

    ``max_failure_count`` failures make the step ``Error``. Below it, the first
    ``soft_threshold`` failures retry at once (a lost message or a killed
    instance is the usual cause); later ones wait ``base * 2^k`` seconds, capped,
    with +/-20% jitter derived from the order id, so orders that failed together
    (an outage) do not all come back in the same second. Deterministic, so tests
    can assert exact times.
    """

    max_failure_count: int = 5
    soft_threshold: int = 2
    base_backoff_seconds: float = 2.0
    max_backoff_seconds: float = 300.0
    #: Deferrals (the remote not called, or down for everyone) do not count as failures;
    #: they wait 1, 2, 4 ... s (at least until the time the agent asked for), capped
    #: low so that orders resume within seconds of the remote's return, for at most
    #: ``deferral_window_seconds`` in a row before the step fails for good.
    deferral_window_seconds: float = 1800.0
    base_deferral_seconds: float = 1.0
    max_deferral_seconds: float = 10.0

    def backoff(self, failure_count: int, order_id: str = "") -> timedelta:
        if failure_count <= self.soft_threshold:
            return timedelta(0)
        exponent = failure_count - self.soft_threshold - 1
        return _grow(
            self.base_backoff_seconds,
            exponent,
            self.max_backoff_seconds,
            f"{order_id}:{failure_count}",
        )

    def deferral_delay(self, deferrals: int, order_id: str = "") -> timedelta:
        """How long the ``deferrals``-th deferral in a row waits at least."""
        return _grow(
            self.base_deferral_seconds,
            deferrals - 1,
            self.max_deferral_seconds,
            f"{order_id}:deferral:{deferrals}",
        )

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

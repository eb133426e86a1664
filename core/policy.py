"""When a step that missed its deadline may run again, and when it gives up."""

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

    def backoff(self, failure_count: int, order_id: str = "") -> timedelta:
        if failure_count <= self.soft_threshold:
            return timedelta(0)
        exponent = min(failure_count - self.soft_threshold - 1, 30)  # 2**30 s is past any cap
        digest = hashlib.sha256(f"{order_id}:{failure_count}".encode()).digest()
        jitter = 0.8 + 0.4 * (digest[0] / 255)  # 0.8 .. 1.2
        seconds = min(self.base_backoff_seconds * 2**exponent * jitter, self.max_backoff_seconds)
        return timedelta(seconds=round(seconds, 3))

    def gives_up(self, failure_count: int) -> bool:
        return failure_count >= self.max_failure_count

"""An attempt's time: when it must stop, how long each try may take, and how long to wait
between tries (docs/contracts.md §3.11, "retries are paced in time").

- The agent must report before the step's ``CompleteBy``, so it stops trying a margin
  before it: a fifth of the time it had, 0.5-5 s.
- No try starts with less than ``min_try_seconds`` left (a try cut that short would
  only turn a call into "may have applied"), and none takes longer than
  ``max_try_seconds``.
- Between tries: equal-jitter exponential backoff. ``Retry-After`` may ask for longer,
  never for less: ``0`` or a date in the past cannot make tries come faster.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from agents.health import HealthPolicy
from agents.outcomes import Try
from core.messages import AgentRequest


@dataclass(frozen=True)
class RemotePolicy:
    max_try_seconds: float = 10.0  # no single try waits longer than this
    #: Stop trying this long before CompleteBy, so the report arrives in time: a
    #: fraction of the time the agent had, clamped.
    reply_margin_fraction: float = 0.2
    reply_margin_min_seconds: float = 0.5
    reply_margin_max_seconds: float = 5.0
    #: No try starts with less time than this before the stop time.
    min_try_seconds: float = 1.0
    backoff_initial_seconds: float = 0.2
    backoff_max_seconds: float = 5.0
    health: HealthPolicy = field(default_factory=HealthPolicy)

    def reply_margin(self, time_left: float) -> float:
        return min(
            max(time_left * self.reply_margin_fraction, self.reply_margin_min_seconds),
            self.reply_margin_max_seconds,
        )


@dataclass(frozen=True)
class Budget:
    """The time one attempt has: tries stop at ``stop_at``."""

    stop_at: datetime
    policy: RemotePolicy

    @classmethod
    def of(cls, request: AgentRequest, policy: RemotePolicy, now: datetime) -> Budget:
        left = (request.complete_by - now).total_seconds()
        return cls(request.complete_by - timedelta(seconds=policy.reply_margin(left)), policy)

    def left(self, now: datetime) -> float:
        return (self.stop_at - now).total_seconds()

    def try_seconds(self, now: datetime) -> float | None:
        """How long a try starting now may take; None if too little time is left to start one."""
        left = self.left(now)
        if left <= 0 or left < self.policy.min_try_seconds:
            return None
        return min(left, self.policy.max_try_seconds)

    def slot_wait(self, now: datetime) -> float:
        """How long to wait for a concurrency slot: while a try could still start."""
        return self.left(now) - self.policy.min_try_seconds

    def fits_after(self, now: datetime, wait: float) -> bool:
        """Could a try still start after waiting ``wait`` seconds from ``now``?"""
        return self.try_seconds(now + timedelta(seconds=wait)) is not None


class Backoff:
    """Equal jitter: uniform in [high/2, high], high = min(max, initial * 2^(failures-1)).
    (Full jitter could draw a wait near 0 try after try.)"""

    def __init__(self, policy: RemotePolicy, rng: random.Random | None = None):
        self._policy = policy
        self._rng = rng or random.Random()

    def __call__(self, failures: int) -> float:
        high = min(
            self._policy.backoff_max_seconds,
            self._policy.backoff_initial_seconds * 2 ** min(failures - 1, 30),
        )
        return self._rng.uniform(high / 2, high)

    def after(self, failed: Try, failures: int) -> float:
        """The wait before the next try: the backoff, or longer if the remote asked."""
        return max(failed.retry_after or 0.0, self(failures))

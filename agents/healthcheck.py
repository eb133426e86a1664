"""An agent's health probe, ``Agent(..., health="/health")`` (docs/contracts.md §3.11 (18),
"a probe settles a lone order").

Orders whose calls fail while nothing else is served look like an outage: with no other
traffic the agent cannot tell (``agents.health``), and they would wait, deferred, for the
whole deferral window. An agent that declares a health path asks its service instead:
a GET on the agent's own base URL plus the path, with the agent's own credentials; a
2xx is *healthy*.

- It is asked when an order's call fails and no other order's call settles whose failure
  it is (nobody else served since, others failing too, or the breaker open).
- Healthy: the service says it serves, so the failing orders' failures are their own.
  They are singled out on that verdict (its time is the evidence: the reply's
  ``evidenceAt``) and counted (contract 3.11's budget); an open breaker closes
  (``EndpointHealth.vouch``) so that they are called, and counted, rather than held.
- Anything else (another status, no answer, no credentials): an outage. The orders ride
  it out, deferred, and 3.14's outage alert tells.

At most one probe per interval per instance (``HealthPolicy.check_interval_seconds``),
however many orders fail: a verdict holds for the interval, and an attempt that finds a
probe in flight does not wait for it. A verdict is only as good as the health endpoint:
declare one that answers 2xx only when the service serves orders.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agents.health import Blame
from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)

#: A probe is not started with less time than this left (its verdict would be "no answer"
#: only because the attempt had no time for one).
MIN_CHECK_SECONDS = 0.2


@dataclass(frozen=True)
class Verdict:
    """What the health probe said: ``healthy`` (a 2xx) or not, ``at`` (epoch s: when it
    answered or gave up), and ``detail`` (for logs and errors)."""

    healthy: bool
    at: float
    detail: str


class Prober(Protocol):
    async def probe(self, path: str, timeout: float) -> tuple[bool, str]:
        """GET ``path`` on the agent's base URL with its credentials, within ``timeout``:
        (a 2xx, what it answered). Never raises for what the service does."""
        ...


class HealthCheck:
    """One agent's health probe on this instance. Times are epoch seconds."""

    def __init__(
        self,
        prober: Prober,
        path: str,
        *,
        interval: float = 10.0,
        timeout: float = 3.0,
        clock: Callable[[], float],
    ):
        self.path = path
        self._prober = prober
        self._interval = interval
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._last: Verdict | None = None
        self._asked_at: float | None = None
        self._asking = False

    def last(self) -> Verdict | None:
        """The latest verdict, however old."""
        with self._lock:
            return self._last

    def fresh(self, now: float) -> Verdict | None:
        """The last verdict, if it is less than one interval old."""
        with self._lock:
            last = self._last
        return last if last is not None and now - last.at < self._interval else None

    async def ask(self, now: float, bound: float) -> Verdict | None:
        """The verdict: the fresh one, else a probe if one is due (at most one an interval,
        bounded by ``bound`` and the timeout), else None (one is in flight or was asked
        within the interval, or there is no time for one)."""
        fresh = self.fresh(now)
        if fresh is not None:
            return fresh
        timeout = min(bound, self._timeout)
        with self._lock:
            if (
                self._asking
                or timeout < MIN_CHECK_SECONDS
                or (self._asked_at is not None and now - self._asked_at < self._interval)
            ):
                return None
            self._asking, self._asked_at = True, now
        try:
            healthy, detail = await self._prober.probe(self.path, timeout)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, it said nothing healthy
            healthy, detail = False, f"GET {self.path}: {type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._asking = False
        verdict = Verdict(healthy, self._clock(), detail)
        with self._lock:
            before, self._last = self._last, verdict
        METRICS.inc("health_checks", healthy=str(healthy).lower())
        if before is None or before.healthy != healthy:
            log.warning(
                "health probe %s: %s (%s)",
                self.path,
                "healthy: failing orders fail on their own" if healthy else "failing: an outage",
                detail,
            )
        return verdict


def judged(
    blame: Blame, latest: Verdict | None, since: float, last_word: float
) -> tuple[Blame, str]:
    """Whose failure an attempt is, the health probe's ``latest`` verdict considered, and
    what to add to its error. ``since``: when the attempt's first failing try began;
    ``last_word``: when the endpoint or its host last answered anyone.

    What answers to other orders settled stands. Otherwise a verdict asked since the
    order first failed decides (healthy: its own failure, the verdict its evidence;
    failing: an outage); an older one says nothing about this failure, but a failing one
    that is the service's last word outweighs the order's flag."""
    if latest is None:
        return blame, ""
    said = f"; its health probe: {latest.detail}"
    if blame.settled:  # (a healthy verdict is the host answering: it may be what settled it)
        return blame, said if latest.healthy and blame.seen == latest.at else ""
    if latest.at >= since:
        return Blame(latest.healthy, latest.at if latest.healthy else None), said
    if blame.own and not latest.healthy and latest.at >= last_word:
        return Blame(False), said
    return blame, ""

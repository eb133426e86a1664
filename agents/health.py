"""What an agent knows of its remote endpoint's health: a circuit breaker that protects
the remote without punishing the orders (docs/contracts.md §3.11).

Two questions, answered from this instance's own calls:

1. *May this call go out now?* While the endpoint looks down (the breaker is open) only
   a trickle of probes does: one at a time, at a growing interval (2, 4, 8, 10 s), and
   orders already known to fail on their own wait behind fresh ones, so a few bad
   orders cannot hold the probe slot while healthy orders wait. Each order deferred
   meanwhile is told when to come back so that it is not sent back for nothing: one
   order at the probe time (to probe), the others once that probe is expected to have
   answered (as long as the last probe took; while a probe is in flight, its try's
   bound, at most ``probe_timeout_seconds``), spread over one probe interval.
   Every return costs a dispatch, a claim, a request and a reply through the shared
   storage, for every order waiting: against a remote that answers slowly, telling each
   to come back every couple of seconds only found the probe still out, and that churn
   slowed every other agent's orders (``bench.isolation``: 120 orders waiting on a
   carrier that answers after 20 s, some 30 returns a second, the storage up to 20 times
   slower to answer).
2. *Whose failure is it?* A transient failure counts against an order only when the
   remote is known to serve others: another order succeeded on this endpoint after
   this one first failed; or, with no other order failing here, another endpoint of
   the same host answered meanwhile, or this order was singled out before
   (``AgentRequest.singled_out``). Anything else looks like an outage: the attempt is a
   deferral and the order's ``FailureCount`` does not grow. With no other traffic at
   all there is no evidence either way, and the order waits, deferred, at most for the
   deferral window (``DEFERRAL_WINDOW_SECONDS``) before it fails for good, unless the
   agent declares a health probe (``agents.healthcheck``): its verdict settles what no
   other order's call did.

   A blame says when its evidence was seen (``Blame.seen``: the answer to another order
   after this one first failed, by its time), and the step's flag ages from that
   (``core.steps.StepRecord.single_out``). A blame on the flag alone brings no new
   evidence (``seen`` None), and neither does the endpoint answering this very order (a
   409): an order's own failures never renew its flag.

The breaker opens when ``trip_keys`` different orders fail, with no success in
between, without being explained (a failure is explained when the order is known to
fail on its own). So a handful of always-failing orders, among healthy traffic, never
opens it; a real outage opens it within three orders.

State is per process (per Functions instance), like Polly's or resilience4j's
breakers: sharing it would cost a storage round trip per call. With N instances the
remote sees up to N probes per interval.
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass

from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)


@dataclass(frozen=True)
class HealthPolicy:
    trip_keys: int = 3  # distinct orders failing, unexplained, with no success between
    probe_interval_seconds: float = 2.0  # the first wait before probing an open endpoint
    probe_interval_max_seconds: float = 10.0
    probe_timeout_seconds: float = 15.0  # a probe not back by then frees the slot
    #: The agent's health probe, if it declares one (``agents.healthcheck``): asked at
    #: most once an interval per instance, and bounded by this timeout.
    check_interval_seconds: float = 10.0
    check_timeout_seconds: float = 3.0


@dataclass(frozen=True)
class Mark:
    """Counters read before an attempt's first failing try: what answered since then?"""

    endpoint: int
    host: int


@dataclass(frozen=True)
class Blame:
    """Whose failure a failed attempt is. ``own``: the order's (counted), else the
    endpoint's (a deferral). ``seen``: when the evidence that blamed it was seen (epoch
    s): an answer to another order after this one first failed, or a health probe's
    healthy verdict; None when the blame brings no new evidence (the order's flag alone,
    the endpoint answering this very order). ``settled``: answers seen during the attempt
    decided it, so no health probe is asked."""

    own: bool
    seen: float | None = None
    settled: bool = False


class _Answers:
    """A count of answers, and the latest two by different keys: when a key other than a
    given one was last answered, in O(1) (not "this order's own 409", say)."""

    def __init__(self) -> None:
        self.count = 0
        #: (key, at, number) of the latest answer, and of the latest by another key
        self._last: tuple[str, float, int] | None = None
        self._other: tuple[str, float, int] | None = None

    def note(self, key: str, at: float) -> None:
        self.count += 1
        if self._last is not None and self._last[0] != key:
            self._other = self._last
        self._last = (key, at, self.count)

    @property
    def last_at(self) -> float | None:
        return self._last[1] if self._last is not None else None

    def by_other(self, key: str, after: int) -> float | None:
        """When a key other than ``key`` was last answered, if that was after answer
        number ``after`` (a ``Mark``'s counter); else None."""
        for entry in (self._last, self._other):
            if entry is not None and entry[0] != key:
                return entry[1] if entry[2] > after else None
        return None


class HostActivity:
    """Answers from any endpoint of one base URL (the agents share one by default)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers = _Answers()

    def note(self, now: float, key: str = "") -> None:
        with self._lock:
            self._answers.note(key, now)

    @property
    def answers(self) -> int:
        with self._lock:
            return self._answers.count

    @property
    def last_answer_at(self) -> float | None:
        with self._lock:
            return self._answers.last_at

    def answered_other(self, key: str, after: int) -> float | None:
        """When another key than ``key`` was last answered, if after answer ``after``."""
        with self._lock:
            return self._answers.by_other(key, after)


@dataclass(frozen=True)
class Admission:
    allowed: bool
    probe: bool = False
    retry_at: float = 0.0  # when not allowed: the earliest time a call may go (epoch s)
    reason: str = ""


class EndpointHealth:
    """One remote endpoint, seen from this process. Times are epoch seconds."""

    def __init__(
        self, name: str, policy: HealthPolicy | None = None, host: HostActivity | None = None
    ):
        self.name = name
        self.policy = policy or HealthPolicy()
        self.host = host or HostActivity()
        self._lock = threading.Lock()
        self._successes = _Answers()
        self._failing: set[str] = set()  # unexplained failures since the last success
        self._open = False
        self._open_until = 0.0
        self._interval = self.policy.probe_interval_seconds
        #: the key probing, since when, and when its try ends at the latest
        self._probe: tuple[str, float, float] | None = None
        #: the probe time an order was told to come back at (to probe)
        self._called_to_probe: float | None = None
        #: how long the last probe took to answer or fail (None: none yet)
        self._probe_took: float | None = None

    # --- queries --------------------------------------------------------------------

    @property
    def successes(self) -> int:
        """Answers from the endpoint so far (a counter: compare two readings)."""
        with self._lock:
            return self._successes.count

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._open

    def admit(
        self, key: str, now: float, *, singled_out: bool = False, bound: float | None = None
    ) -> Admission:
        """May a call for ``key`` go out at ``now``? ``bound``: how long its try may take
        (a probe's answer is not to be expected later; None: ``probe_timeout_seconds``)."""
        bound = self._bound(bound)
        with self._lock:
            if not self._open:
                return Admission(True)
            if self._probe is not None:
                prober, since, _ = self._probe
                if now < since + self.policy.probe_timeout_seconds:
                    return Admission(
                        False,
                        retry_at=self._come_back(key, now, bound),
                        reason=f"a probe for {prober} is in flight",
                    )
                self._probe = None  # that probe never came back: free the slot
            if now < self._open_until:
                called = self._called_to_probe != self._open_until
                return Admission(
                    False,
                    retry_at=self._come_back(key, now, bound),
                    reason="waiting to probe" if called else "waiting for the next probe",
                )
            if singled_out and now < self._open_until + self._interval:
                # Fresh orders probe first: an order known to fail on its own proves little.
                return Admission(
                    False,
                    retry_at=self._open_until + self._interval,
                    reason="orders that fail on their own probe last",
                )
            self._probe = (key, now, now + bound)
            return Admission(True, probe=True, reason="probe")

    def _probe_ended(self, now: float) -> None:
        """(With the lock held.) The probe in flight, if any, answered or failed at ``now``:
        how long it took is how long the next one is expected to take."""
        if self._probe is not None:
            self._probe_took = now - self._probe[1]
        self._probe = None

    def _bound(self, bound: float | None) -> float:
        timeout = self.policy.probe_timeout_seconds
        return timeout if bound is None else min(bound, timeout)

    def _come_back(self, key: str, now: float, bound: float) -> float:
        """When an order the open breaker turns away should come back (with the lock held):
        not before a call can let it through. With a probe in flight, once the probe can
        have answered (it alone can close the breaker); before the probe time, one order at
        that time (to probe), the others once that probe is expected to have answered (as
        long as the last probe took, at most its try's bound)."""
        if self._probe is not None:
            _, _, until = self._probe
            return self._spread(key, max(self._open_until, now + self._interval, until))
        if now >= self._open_until:
            return now  # the probe is due: whoever comes next makes it
        if self._called_to_probe != self._open_until:
            self._called_to_probe = self._open_until
            return self._open_until
        # As long as the last probe took (an outage that answers 503 at once: hardly any
        # time), else as long as its try may take.
        took = bound if self._probe_took is None else min(self._probe_took, bound)
        return self._spread(key, self._open_until + took)

    def _spread(self, key: str, at: float) -> float:
        """``at``, or a little later for most keys (up to one probe interval, the same for
        a key every time): the orders told to come back after a probe do not all come in
        the same instant, as a herd of dispatches and requests through the storage."""
        return at + self._interval * (zlib.crc32(key.encode()) / 2**32)

    def mark(self) -> Mark:
        with self._lock:
            return Mark(self._successes.count, self.host.answers)

    def blames(self, key: str, *, mark: Mark | None, singled_out: bool) -> bool:
        """Is a failed attempt of ``key`` its own failure (rather than the endpoint's)?"""
        return self.attribute(key, mark=mark, singled_out=singled_out).own

    def attribute(self, key: str, *, mark: Mark | None, singled_out: bool) -> Blame:
        """Whose failure a failed attempt of ``key`` is, and on what evidence.

        ``mark``: the counters read before this attempt's first failing try.
        ``singled_out``: the order failed on its own recently (the flag ages:
        ``core.steps.StepRecord.singled_out_now``).
        """
        with self._lock:
            if self._open:
                return Blame(False)
            if mark is not None and self._successes.count > mark.endpoint:
                # This endpoint answered meanwhile: someone else served (the evidence, by
                # its time), or only this order (a 409: up, and busy with this key).
                return Blame(True, self._successes.by_other(key, mark.endpoint), settled=True)
            if self._failing - {key}:
                return Blame(False)  # others fail here too: that looks like the endpoint
            if mark is not None and self.host.answers > mark.host:
                # The host serves its other endpoints, and only this fails.
                return Blame(True, self.host.answered_other(key, mark.host), settled=True)
            # The flag alone: no new evidence (the step's flag keeps its age).
            return Blame(
                singled_out
                and (self._successes.last_at is not None or self.host.last_answer_at is not None)
            )

    def last_word_at(self) -> float:
        """When the endpoint, or its host, last answered anyone (epoch s; 0: never)."""
        with self._lock:
            times = (self._successes.last_at, self.host.last_answer_at)
        return max((t for t in times if t is not None), default=0.0)

    def vouch(self) -> None:
        """The agent's health probe answered healthy (``agents.healthcheck``): the service
        says it serves, so the failures here are the orders' own. An open breaker closes
        (its failing orders are called again, and counted). No answer of this endpoint:
        the runner tells the host (``HostActivity``) of it."""
        with self._lock:
            self._failing.clear()
            self._probe = None
            self._close("its health probe answered healthy")

    def _close(self, why: str) -> None:
        """(With the lock held.) An open breaker closes; the next trip probes at 2 s."""
        if self._open:
            self._open = False
            self._interval = self.policy.probe_interval_seconds
            log.warning("circuit for %s closed: %s", self.name, why)
            METRICS.inc("breaker_closed")

    def next_probe_at(self, now: float, key: str = "", bound: float | None = None) -> float:
        """When ``key``, whose attempt the open breaker ended, should come back (``now``
        while it is closed)."""
        bound = self._bound(bound)
        with self._lock:
            return self._come_back(key, now, bound) if self._open else now

    # --- what calls found -------------------------------------------------------------

    def record_refusal(self, key: str, now: float) -> None:
        """A permanent 4xx: something in front of the service (a gateway, a validator) or
        the service answered about this request. That proves the host answers, not that the
        endpoint serves orders: it counts neither as a success (no breaker closes on it, no
        other order is blamed because of it) nor as a failure; a probe it answered frees the
        probe slot."""
        with self._lock:
            if self._probe is not None and self._probe[0] == key:
                self._probe_ended(now)

    def record_answer(self, key: str, now: float) -> None:
        """The endpoint answered (2xx, or a permanent 4xx about the request): it is up."""
        with self._lock:
            self._successes.note(key, now)
            self.host.note(now, key)
            self._failing.clear()
            self._probe_ended(now)
            self._close(f"{key} got through")

    def record_failure(self, key: str, now: float, *, explained: bool, probe: bool) -> None:
        """A transient failure (5xx, 408/425/429, connection error, timeout)."""
        with self._lock:
            if self._open and (probe or (self._probe is not None and self._probe[0] == key)):
                # A failed probe lengthens the wait before the next one: 2 s after the
                # trip, then 4, 8, 10, 10...
                self._probe_ended(now)
                self._open = True
                self._interval = min(self._interval * 2, self.policy.probe_interval_max_seconds)
                self._open_until = now + self._interval
                return
            if self._open:
                return  # admitted before it opened
            if not explained:
                self._failing.add(key)
            if len(self._failing) >= self.policy.trip_keys:
                self._open = True
                self._open_until = now + self._interval
                log.warning(
                    "circuit for %s opened: %d orders failed with no success between; "
                    "probing every %.0f-%.0f s",
                    self.name,
                    len(self._failing),
                    self.policy.probe_interval_seconds,
                    self.policy.probe_interval_max_seconds,
                )
                METRICS.inc("breaker_opened")

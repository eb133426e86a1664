"""One attempt of an agent, over any kind of try (docs/contracts.md §3.11).

The attempt is made of four parts, each its own:

- **admission**: an order that cannot be sent is refused before anything is asked; an
  agent an operator paused (``core.controls``, read through ``runtime``) is not called:
  the attempt is deferred as paused, and its step waits for the resume; a concurrency
  slot (``agents.limits``) must come while a try could still start, else the attempt is
  deferred, not called; the endpoint's breaker (``agents.health``) lets the call out, or
  defers it until the remote may be called again; each try waits for a token of the
  agent's call rate, if it has one (none in time: deferred, not called), or, after a
  release (a resume, the end of an outage), its turn from the agent's ``Ramp``, from one
  call a second doubling to the agent's limits (none in time: deferred to about the next
  free turn, spread over a doubling);
- **budget and pacing** (``agents.pacing``): when tries stop, how long each may take,
  and the wait between them;
- **the try** (``agents.outcomes.TryKind``): an HTTP call (``agents.remote``) or a
  Python handler (``agents.python``);
- **classification** of the attempt: a success, a refusal (settling or not), or failed
  tries that are this order's failure (``transient``, counted, with when the evidence
  that blamed it was seen: ``CallOutcome.evidence_at``) or the endpoint's (``deferred``,
  not counted), with whether any may have applied; what no other order's call settles,
  the agent's health probe does, if it declares one (``agents.healthcheck``). A call
  that runs on past the attempt goes with its report (``CallOutcome.running``).

How each call ended (unanswered, or answered) is also told to the agent's outage watch
(``agents.outage_watch``): memory only, but for a report when its view changes.

(Over 400 lines: the four parts share one attempt's state, ``_Tries``, and the loop that
moves it; split, each would take all of it.)
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from agents.health import EndpointHealth, HostActivity, Mark
from agents.healthcheck import HealthCheck, Verdict, judged
from agents.limits import CallRate, CallSlots, Ramp, Slot
from agents.outage_watch import OutageWatch
from agents.outcomes import CallOutcome, Try, TryKind, applied_of
from agents.pacing import Backoff, Budget, RemotePolicy
from agents.threads import OwnThreads
from core.control_cache import HOLD_MIN, AgentRuntime
from core.controls import Limits
from core.messages import AgentRequest
from core.outages import ramp_end, spread
from core.outcome import Applied, Outcome
from core.timefmt import iso
from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)

#: The agent's runtime controls are read at most once a period, from the state store,
#: through a client whose requests are bounded: past this, something hangs.
RUNTIME_READ_BOUND = 60.0


class AttemptRunner[K: TryKind]:
    """The attempts of one agent: its breakers (one per endpoint), its concurrency limit
    and its pacing, around its kind of try."""

    def __init__(
        self,
        kind: K,
        policy: RemotePolicy | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        *,
        concurrency: int | None = None,
        rate: float | None = None,
        runtime: Callable[[], AgentRuntime] | None = None,
        runtime_at_hand: Callable[[], AgentRuntime | None] | None = None,
        threads: OwnThreads | None = None,
        watch: OutageWatch | None = None,
        check: HealthCheck | None = None,
    ):
        """``runtime``: what an operator set for the agent now (paused, its limits), asked
        before each attempt; without it, ``concurrency`` and ``rate`` hold for good. It may
        read the state store (once a period): with ``threads``, it is asked on the agent's
        own threads (``agents.threads``), off the event loop, unless ``runtime_at_hand``
        answers (the same, when no read is due; None: a read is due). ``sleep``: the waits between
        tries, awaited (an attempt that waits holds no thread). ``watch``: told how each
        call ended, for the agent's shared outage record (``agents.outage_watch``).
        ``check``: the agent's health probe, if it declares one (``agents.healthcheck``)."""
        self.watch = watch
        self.check = check
        self.kind = kind
        self.policy = policy or RemotePolicy()
        #: None: no limit of its own (the host's concurrency limits it).
        self.slots = CallSlots(concurrency) if concurrency is not None else None
        self.rate = CallRate(rate)
        self._runtime = runtime
        self._runtime_at_hand = runtime_at_hand
        self._threads = threads
        self._clock = clock
        self._sleep = sleep
        self._backoff = Backoff(self.policy, rng)
        #: the calls take their turns from the ramp: a release and when its ramp ends
        self.ramp = Ramp()
        self._release: tuple[datetime, datetime] | None = None
        self._health: dict[str, EndpointHealth] = {}
        self._host = HostActivity()  # every endpoint of an agent shares its host
        self._lock = threading.Lock()
        #: the last healthy verdict of the health probe that the host and breakers were told
        self._vouched_at: float | None = None

    def _answered(self, now: datetime) -> None:
        if self.watch is not None:
            self.watch.answered(now)

    def _vouched(self, now: datetime) -> Verdict | None:
        """The health probe's healthy verdict, while it holds (None: none, or failing)."""
        if self.check is None:
            return None
        verdict = self.check.fresh(now.timestamp())
        return verdict if verdict is not None and verdict.healthy else None

    async def _ask_health(self, budget: Budget) -> Verdict | None:
        """Ask the health probe (at most once an interval per instance; within what the
        attempt has left). A new healthy verdict is the host answering (``HostActivity``:
        evidence, by its time, for the orders failing since) and closes this agent's open
        breakers."""
        if self.check is None:
            return None
        now = self._clock()
        verdict = await self.check.ask(now.timestamp(), budget.left(now))
        if verdict is None or not verdict.healthy:
            return verdict
        with self._lock:
            new, self._vouched_at = verdict.at != self._vouched_at, verdict.at
            endpoints = list(self._health.values())
        if new:
            self._host.note(verdict.at, f"GET {self.check.path}")
            for endpoint in endpoints:
                endpoint.vouch()
        return verdict

    def health(self, path: str) -> EndpointHealth:
        with self._lock:
            if path not in self._health:
                self._health[path] = EndpointHealth(
                    self.kind.endpoint(path), self.policy.health, self._host
                )
            return self._health[path]

    def close(self) -> None:
        self.kind.close()

    # --- admission --------------------------------------------------------------------

    async def call(self, request: AgentRequest) -> CallOutcome:
        """The call for one attempt, tried until it succeeds, is refused, is deferred, or
        time runs out. Never raises for what the remote does. Awaited on the caller's event
        loop: its waits (for a slot, a token, the backoff, the remote) hold no thread."""
        if (unsendable := _unsendable(request)) is not None:
            # Refused here, before any admission: the endpoint was not asked, so this
            # says nothing about its health (and must not close an open breaker).
            return CallOutcome(Outcome.REFUSED, error=unsendable)
        now = self._clock()
        budget = Budget.of(request, self.policy, now)
        if self._runtime is not None:
            runtime = await self._read_runtime(self._runtime)
            if runtime.pause is not None:
                METRICS.inc("agent_paused_deferrals")
                pause = runtime.pause
                return CallOutcome(
                    Outcome.DEFERRED,
                    error=f"{request.path}: not called: agent {runtime.agent} is paused (by "
                    f"{pause.by} at {iso(pause.since)}: {pause.reason}); the step waits for "
                    "the resume",
                    not_before=now + HOLD_MIN,
                    paused=True,
                )
            self._limit(runtime.limits, now, runtime.released_at)
        if self.slots is None:
            return await self._attempt(request, budget, None)
        wait = budget.slot_wait(now)
        slot = await self.slots.take(wait)
        if slot is None:
            METRICS.inc("agent_busy_deferrals")
            return CallOutcome(
                Outcome.DEFERRED,
                error=f"{request.path}: all {self.slots.limit} call slots of this agent on "
                f"this instance stayed busy for {max(wait, 0):.1f} s, until too little time "
                "was left for a call; not called (concurrency limit)",
                not_before=self._clock(),
            )
        try:
            return await self._attempt(request, budget, slot)
        finally:
            slot.release()

    async def _read_runtime(self, runtime: Callable[[], AgentRuntime]) -> AgentRuntime:
        if self._threads is None:
            return runtime()
        if self._runtime_at_hand is not None and (known := self._runtime_at_hand()) is not None:
            return known  # no read due: no thread needed
        return await self._threads.run(runtime, bound=RUNTIME_READ_BOUND, what="controls read")

    def _limit(self, limits: Limits, now: datetime, released_at: datetime | None = None) -> None:
        """The limits in force now: a change reaches the attempts that start after it.
        Since a release (``released_at``: a resume, the end of an outage), until the ramp
        reaches the agent's limits (``core.outages.ramp_end``), the tries take their turns
        from ``ramp`` (one call a second at first, doubling) instead of the rate's tokens."""
        if self.slots is None:
            self.slots = CallSlots(limits.concurrency)
        else:
            self.slots.resize(limits.concurrency)
        self.rate.set_rate(limits.rate, now.timestamp())
        self._release = None
        if released_at is not None and now < ramp_end(limits, released_at):
            self._release = (released_at, ramp_end(limits, released_at))

    async def _attempt(
        self, request: AgentRequest, budget: Budget, slot: Slot | None
    ) -> CallOutcome:
        tries = _Tries()
        outcome = await self._tries(request, budget, slot, tries)
        return _follow_run(outcome, tries.last)

    # --- the tries, paced -------------------------------------------------------------

    async def _tries(
        self, request: AgentRequest, budget: Budget, slot: Slot | None, tries: _Tries
    ) -> CallOutcome:
        key, path = request.idempotency_key, request.path
        health = self.health(path)
        while True:
            now = self._clock()
            timeout = budget.try_seconds(now)
            if timeout is None:
                # Too little time for an answer: a try cut this short would only turn a
                # call into "may have applied". Not starting it is honest: not applied.
                break
            waited = await self._turn(key, path, budget, now, tries)
            if isinstance(waited, CallOutcome):
                return waited  # no turn or token in time: deferred, not called
            if waited:
                now = self._clock()
                timeout = budget.try_seconds(now)
                if timeout is None:  # pragma: no cover - the turn came in time for one
                    break
            admission = health.admit(
                key,
                now.timestamp(),
                singled_out=request.singled_out or tries.mark is not None,
                bound=timeout,
            )
            if not admission.allowed and not tries.readmitted:
                # The endpoint looks down for everyone: the health probe, if any, says
                # whether it is (a healthy verdict closes the breaker: call, and count).
                tries.readmitted = True
                verdict = await self._ask_health(budget)
                if verdict is not None and verdict.healthy:
                    continue
            if not admission.allowed:
                METRICS.inc("breaker_deferrals")
                when = datetime.fromtimestamp(admission.retry_at, UTC)
                return tries.deferred(
                    f"{path}: circuit open ({admission.reason}); not calling it before {iso(when)}",
                    when,
                )
            # Taken before the try: a success elsewhere while this try hangs also shows the
            # endpoint serving others.
            before, before_at = health.mark(), now
            attempt = await self.kind.run(request, timeout, slot)
            tries.last = attempt
            now = self._clock()
            if attempt.applied is Applied.YES:
                health.record_answer(key, now.timestamp())
                self._answered(now)
                return CallOutcome(Outcome.SUCCEEDED, result=attempt.result, tries=tries.count + 1)
            if not attempt.retryable:
                health.record_refusal(key, now.timestamp())
                # Refused now; an earlier try of this attempt may still have applied.
                return CallOutcome(
                    Outcome.REFUSED,
                    error=attempt.error,
                    applied=applied_of(tries.failed),
                    tries=tries.count + 1,
                    settled=attempt.settles,
                )
            if tries.mark is None:
                tries.mark, tries.since = before, before_at.timestamp()
            now = await self._failed(request, health, budget, tries, attempt, admission.probe)
            tries.failed.append(attempt)
            wait = self._backoff.after(attempt, tries.count)
            if not budget.fits_after(now, wait):
                if attempt.retry_after is not None:
                    # The service said when it may be called again: never before that, even
                    # when our own backoff is the longer wait (then not before that either).
                    later = max(wait, attempt.retry_after)
                    return tries.deferred(
                        f"{attempt.error}; the service asked to wait {attempt.retry_after:.0f} s "
                        f"(Retry-After), which with the backoff ({wait:.0f} s) is past the "
                        "step's deadline",
                        now + timedelta(seconds=later),
                    )
                break
            METRICS.inc("remote_retries")
            log.info(
                "remote call failed (try %d), retrying in %.2f s: %s",
                tries.count,
                wait,
                attempt.error,
            )
            await self._sleep(wait)
        return self._classify(request, health, tries)

    async def _failed(
        self,
        request: AgentRequest,
        health: EndpointHealth,
        budget: Budget,
        tries: _Tries,
        attempt: Try,
        probe: bool,
    ) -> datetime:
        """Record a try that failed transiently (what the endpoint's health and the outage
        watch learn from it); the time after it."""
        key, now = request.idempotency_key, self._clock()
        if attempt.answered:
            health.record_answer(key, now.timestamp())  # up, and busy with this key
            self._answered(now)
            return now
        assert tries.mark is not None
        settled = health.successes > tries.mark.endpoint
        if not settled and self._vouched(now) is None:
            # Nobody served since this order first failed: ask the service (at most once
            # an interval per instance, whoever asks).
            await self._ask_health(budget)
            now = self._clock()
        explained = request.singled_out or settled or self._vouched(now) is not None
        health.record_failure(key, now.timestamp(), explained=explained, probe=probe)
        if self.watch is not None and not explained:
            self.watch.failed(now, attempt.error)
        return now

    async def _turn(
        self, key: str, path: str, budget: Budget, now: datetime, tries: _Tries
    ) -> CallOutcome | bool:
        """Wait for this try's turn: from the ramp after a release, else a token of the
        agent's call rate (if it has one). True if it waited; the deferral if no turn or
        token comes while a try could still start."""
        max_wait = budget.left(now) - self.policy.min_try_seconds
        release = self._release
        if release is not None and now < release[1]:
            # Released from a pause or an outage: the calls take their turns from the
            # ramp (from one a second, doubling), whichever attempt they belong to.
            wait, next_turn = self.ramp.reserve(release[0].timestamp(), now.timestamp(), max_wait)
            if wait is None:
                METRICS.inc("agent_ramp_deferrals")
                return tries.deferred(
                    f"{path}: released gently after a pause or an outage (calls ramp up "
                    "from one a second, doubling every few seconds): no turn before the "
                    "deadline; not called",
                    spread(key, datetime.fromtimestamp(next_turn, UTC)),
                )
        elif self.rate.rate is not None:
            token = self.rate.reserve(now.timestamp(), max_wait)
            if token is None:
                METRICS.inc("agent_rate_deferrals")
                return tries.deferred(
                    f"{path}: the agent's call rate ({self.rate.rate:g} a second on this "
                    "instance) leaves no time for a call before the deadline; not called",
                    now,
                )
            wait = token
        else:
            return False
        if wait > 0:
            await self._sleep(wait)
            return True
        return False

    # --- classification ---------------------------------------------------------------

    def _classify(
        self, request: AgentRequest, health: EndpointHealth, tries: _Tries
    ) -> CallOutcome:
        """Time ran out after failed tries (or before any): whose failure is it?"""
        now = self._clock()
        if not tries.failed:
            return CallOutcome(
                Outcome.DEFERRED, error="no time left to call before the deadline", not_before=now
            )
        last = tries.failed[-1]
        key = request.idempotency_key
        blame = health.attribute(key, mark=tries.mark, singled_out=request.singled_out)
        latest = self.check.last() if self.check is not None else None
        blame, said = judged(blame, latest, tries.since, health.last_word_at())
        if blame.own:
            return CallOutcome(
                Outcome.TRANSIENT,
                error=last.error + said,
                applied=applied_of(tries.failed),
                tries=tries.count,
                evidence_at=None if blame.seen is None else datetime.fromtimestamp(blame.seen, UTC),
            )
        return tries.deferred(
            f"{last.error}; {request.path} is failing for other orders too, or has served none "
            f"since: waiting for it rather than counting it against this order{said}",
            datetime.fromtimestamp(health.next_probe_at(now.timestamp(), key), UTC),
        )


@dataclass
class _Tries:
    """What one attempt's tries did so far."""

    failed: list[Try] = field(default_factory=list)
    #: the last try made (a call it left running decides what the attempt reports)
    last: Try | None = None
    #: what had answered before the attempt's first failing try
    mark: Mark | None = None
    #: an open breaker's admission was asked again after a healthy verdict (once)
    readmitted: bool = False
    #: when the attempt's first failing try began (epoch s)
    since: float = 0.0

    @property
    def count(self) -> int:
        return len(self.failed)

    def deferred(self, reason: str, not_before: datetime) -> CallOutcome:
        return CallOutcome(
            Outcome.DEFERRED,
            error=reason,
            applied=applied_of(self.failed),
            not_before=not_before,
            tries=self.count,
        )


def _follow_run(outcome: CallOutcome, last: Try | None) -> CallOutcome:
    """A call the attempt's last try left running goes with the report: its success, if
    it has just ended with one, is the report; else the report says it runs on (and may
    apply), and its end is reported when it comes."""
    if outcome.kind is Outcome.SUCCEEDED or last is None or last.running is None:
        return outcome
    ended = last.running.ended()
    if ended is not None and ended.applied is Applied.YES:
        return CallOutcome(Outcome.SUCCEEDED, result=ended.result, tries=outcome.tries)
    return replace(outcome, applied=Applied.MAYBE, running=last.running)


def _unsendable(request: AgentRequest) -> str | None:
    """Why the order cannot be a JSON body, or None."""
    try:
        json.dumps(request.order, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        return f"{request.path}: the order cannot be sent as JSON ({exc})"
    return None

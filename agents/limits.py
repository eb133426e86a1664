"""An agent's limits, per instance: at most N calls at once (``CallSlots``) and at most R
calls a second (``CallRate``, a token bucket). Both come from the agent's declaration
(``core.workflows.Agent.concurrency`` and ``rate``) unless an operator changed them at
runtime (``core.controls``): the runner applies what is in force before each attempt
(``resize``, ``set_rate``), so a change reaches calls that start after it; a call already
running is never stopped.

An attempt takes a slot before its first try and gives it back when it ends (its
retries and their backoff included: N attempts in progress). It waits for one on its
event loop (the agents are ``async``: a waiting attempt holds no thread); each try is handed the
slot (``agents.outcomes.TryKind.run``). A call that cannot be stopped when its
attempt ends (a Python handler still running in its thread) holds the slot until it
returns, so "at most N at once" holds for what really runs. An
attempt that gets no slot while a try could still start is not called at all: the
client reports it ``deferred`` (no failure of the order). Lowering N lets the calls
running finish; new ones wait until fewer than N run.

Each try (a call of the remote) takes a token first. Tokens come at R a second, at most
max(1, R) saved up (a burst of one second's worth); a try that would have to wait past
the time left for it is not made (``deferred``, not counted).

After a release (a resume, the end of an outage: ``core.outages``) the tries take their
turn from a ``Ramp`` instead, until it reaches the agent's limits: one call a second at
first, doubling every few seconds, at most a second's worth saved up. The turns are
counted from the release, not from each attempt's start, so the attempts that all start
at the release (the held steps) share one growing rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from core.outages import ramp_call_at, ramp_calls, ramp_rate_at


class Slot:
    """One slot, held by its attempt and by any call the attempt left running; free
    again when the last of them lets go."""

    def __init__(self, slots: CallSlots):
        self._slots = slots
        self._holders = 1
        self._lock = threading.Lock()

    def hold(self) -> None:
        with self._lock:
            if self._holders <= 0:
                raise RuntimeError("this slot was given back already")
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            free = self._holders == 0
        if free:
            self._slots._give_back()


class CallSlots:
    """At most ``limit`` attempts at once. Taken by an attempt on an event loop (``take``
    awaits, it never blocks a thread); given back from any thread (a Python handler's, when
    it returns), which wakes the waiters on their own loops."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("a concurrency limit is at least 1")
        self._limit = limit
        self._lock = threading.Lock()
        self._taken = 0
        #: attempts waiting for a slot: each is woken on its own loop to look again
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def limit(self) -> int:
        with self._lock:
            return self._limit

    def resize(self, limit: int) -> None:
        """A new limit for the attempts that start from now on."""
        if limit < 1:
            raise ValueError("a concurrency limit is at least 1")
        with self._lock:
            if limit == self._limit:
                return
            self._limit = limit
            waiters = list(self._waiters)
        _wake(waiters)

    async def take(self, wait: float) -> Slot | None:
        """A slot, waiting at most ``wait`` seconds for one; None if none came free."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(wait, 0.0)
        while True:
            with self._lock:
                if self._taken < self._limit:
                    self._taken += 1
                    return Slot(self)
                left = deadline - loop.time()
                if left <= 0:
                    return None
                waiter: asyncio.Future[None] = loop.create_future()
                entry = (loop, waiter)
                self._waiters.append(entry)
            try:
                # given back, resized, or timed out: look again
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                pass
            finally:
                with self._lock:
                    if entry in self._waiters:
                        self._waiters.remove(entry)

    def _give_back(self) -> None:
        with self._lock:
            self._taken -= 1
            waiters = list(self._waiters)
        _wake(waiters)

    @property
    def in_use(self) -> int:
        with self._lock:
            return self._taken


def _wake(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    """Every waiter looks again (there are at most the host's concurrency of them): the
    first to find a free slot takes it, the others wait on."""
    for loop, waiter in waiters:
        # A loop that has closed raises: nobody waits there any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class CallRate:
    """At most ``rate`` calls a second (None: no limit): a token bucket holding at most
    max(1, rate) tokens. ``reserve`` takes the next token and says how long to wait for
    it; tokens taken ahead are owed, so callers queue in the order they asked."""

    def __init__(self, rate: float | None = None):
        self._lock = threading.Lock()
        self._rate: float | None = None
        self._tokens = 0.0
        self._at: float | None = None
        self.set_rate(rate)

    @property
    def rate(self) -> float | None:
        return self._rate

    def set_rate(self, rate: float | None, now: float | None = None) -> None:
        if rate is not None and not rate > 0:
            raise ValueError("a call rate is more than 0 calls a second")
        with self._lock:
            if rate == self._rate:
                return
            if self._rate is not None and now is not None:
                self._refill(now)
            self._rate = rate
            if rate is None:
                self._tokens, self._at = 0.0, None
            else:
                self._tokens = min(self._tokens, self._burst) if self._at is not None else 1.0

    @property
    def _burst(self) -> float:
        return max(1.0, self._rate or 1.0)

    def _refill(self, now: float) -> None:
        assert self._rate is not None
        if self._at is not None and now > self._at:
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        if self._at is None or now > self._at:
            self._at = now

    def reserve(self, now: float, max_wait: float) -> float | None:
        """Take a token at ``now`` (seconds): how long to wait before the call, or None
        (nothing taken) if that would be longer than ``max_wait``."""
        with self._lock:
            if self._rate is None:
                return 0.0
            self._refill(now)
            wait = 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self._rate
            if wait > max_wait:
                return None
            self._tokens -= 1.0
            return wait


class Ramp:
    """The turns of the calls after a release: the k-th call since ``released`` (epoch
    seconds) may go ``ramp_call_at(k)`` after it, with at most a second's worth of calls
    saved up (a call that comes late does not let a burst through)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._released: float | None = None
        self._taken = 0.0

    def reserve(self, released: float, now: float, max_wait: float) -> tuple[float | None, float]:
        """Take the next turn at ``now``: how long to wait for it (None, nothing taken, if
        longer than ``max_wait``), and when the next turn is (epoch seconds)."""
        with self._lock:
            if released != self._released:
                self._released, self._taken = released, 0.0
            elapsed = now - released
            saved = max(1.0, ramp_rate_at(elapsed))
            turn = max(self._taken, ramp_calls(elapsed) - saved) + 1.0
            at = released + ramp_call_at(turn)
            wait = max(at - now, 0.0)
            if wait > max_wait:
                return None, at
            self._taken = turn
            return wait, at

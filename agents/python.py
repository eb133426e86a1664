"""Python agents: a step that is a function of this app rather than an HTTP call.

Declare it (``declarations/``)::

    from agents.python import NotApplied, Refused

    def reserve_stock(
        order: dict[str, Any],
        *,
        idempotency_key: str,  # "<orderId>:<step>", the same on every try and attempt
        deadline: datetime,    # UTC: when the agent stops waiting for this call
        step: str,             # the step (or compensation) being run
        attempt: int,          # the step's attempt, from 1
    ) -> dict[str, Any] | None:
        ...
        return {"reservation": "r-1"}  # the step's result (None: {})

    Agent("stock", kind="python", handler=reserve_stock, concurrency=4)

The handler gets its own copy of the order. It is called with those five keyword
arguments (a handler may take ``**kwargs`` instead of some); one that cannot accept
them is refused when the agent is built. It runs under the same discipline as an HTTP
call (``agents.runner`` runs its attempts, with the same admission, pacing, breaker and
classification; this module is only its kind of try), and says what it did by how it ends:

- returns (a dict; None is ``{}``; any other value ``{"value": v}``; values JSON cannot
  carry become their text): like a 2xx, applied; the step succeeds;
- raises ``NotApplied(reason, retry_after=None)``: like a 503 (with ``Retry-After``),
  nothing applied; retried with backoff, or after ``retry_after`` seconds (one past
  the step's deadline ends the attempt as a deferral);
- raises ``Refused(reason)``: like a 4xx, nothing applied, never retried: the step fails;
- raises anything else: like a 500, *may have applied*; retried;
- is still running at ``deadline``: like no answer, *may have applied*; retried.

The handler is synchronous user code: it runs on a thread of its own (never on the
runtime's shared pool, nor on the event loop where the agent awaits it), at most
``concurrency`` of them at once per agent and instance, since a run holds its attempt's
concurrency slot until it returns (``agents.limits``): one agent's handlers can never
take the threads another agent or function needs. The agent stops waiting for it at the try's
deadline (the time left before the step's ``CompleteBy``, less the reply margin, and
at most ``max_try_seconds``), but a thread cannot be stopped: the call runs on. A retry
for the same key in this process does not start a second run while one is still
running: it waits for that one (whose outcome it reports). A handler must still be
idempotent on ``idempotency_key``: another instance may run the step after this one's
attempt expired. A running handler keeps its concurrency slot until it returns
(``agents.limits``), so ``concurrency`` bounds what really runs.

A handler that outlives its attempt is still the step's (docs/contracts.md §3.11): the
attempt's report says it runs on (``runningUntil``, ``HANDLER_LEASE_SECONDS`` ahead),
the agent renews that every third of the lease while it runs, and reports its outcome
when it ends, like a remote's late answer (a success completes the step). While a run
is reported, the step's compensation does not start; if the instance dies, the reports
stop and the compensation goes ahead once the last one lapses.

Every attempt still ends in exactly one reply (``agents.agent``), sent even after the
step's deadline (late evidence, docs/contracts.md §3.11). A handler authenticates in its
own code (a python agent has no ``auth``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import inspect
import itertools
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from agents.limits import Slot
from agents.outcomes import Try
from agents.remote import MAX_RETRY_AFTER_SECONDS
from core.messages import AgentRequest
from core.outcome import Applied
from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)

Handler = Callable[..., Any]
_REASON_CHARS = 300
#: How long a "still running" report holds the step's compensation; renewed every third.
HANDLER_LEASE_SECONDS = 30.0
#: A run still going after this long is reported as given up on (its end reported "may
#: have applied"): the step's compensation is held no longer, and the log says so.
HANDLER_MAX_HOLD_SECONDS = 3600.0
_RUNS = itertools.count(1)
_HOST = f"{socket.gethostname()[:40]}-{os.getpid()}"


class _Running:
    """A handler run that outlived its try (``agents.outcomes.Running``)."""

    def __init__(
        self,
        future: concurrent.futures.Future[Try],
        clock: Callable[[], datetime],
        lease: float,
        name: str,
        max_hold: float = HANDLER_MAX_HOLD_SECONDS,
    ):
        self._future = future
        self._clock = clock
        self._lease = lease
        self._name = name
        self._max_hold = max_hold
        self.runner = f"{_HOST}:{next(_RUNS)}"

    def until(self) -> datetime:
        return self._clock() + timedelta(seconds=self._lease)

    def ended(self) -> Try | None:
        return self._future.result() if self._future.done() else None

    def watch(self, heartbeat: Callable[[datetime], None], ended: Callable[[Try], None]) -> None:
        context = contextvars.copy_context()
        give_up_at = time.monotonic() + self._max_hold

        def run() -> None:
            while True:
                try:
                    outcome = self._future.result(timeout=self._lease / 3)
                    break
                except concurrent.futures.TimeoutError:
                    if time.monotonic() >= give_up_at:
                        METRICS.inc("python_agent_runs_given_up")
                        log.error(
                            "the handler of %s still runs after %.0f s: no longer holding its "
                            "step's compensation",
                            self._name,
                            self._max_hold,
                        )
                        outcome = Try(
                            Applied.MAYBE,
                            True,
                            f"the handler still runs after {self._max_hold:.0f} s: given up on "
                            "(it may have applied)",
                        )
                        # No longer held, but still the step's: when it does end, its
                        # outcome is reported like a remote's late answer (a success after
                        # its undo began is the worst news: never swallowed).
                        self._future.add_done_callback(
                            lambda done: context.copy().run(ended, done.result())
                        )
                        break
                    heartbeat(self.until())
            ended(outcome)

        threading.Thread(
            target=context.run, args=(run,), name=f"watch-{self._name}", daemon=True
        ).start()


class NotApplied(Exception):
    """Nothing was applied, and asking again may work (like a 503): retried with backoff,
    or after ``retry_after`` seconds. One that reaches past the step's deadline ends the
    attempt as a deferral, as ``Retry-After`` does."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class Refused(Exception):
    """Nothing was applied, and asking again cannot help (like a 4xx): the step fails."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def check_handler(handler: Handler) -> None:
    """Raise TypeError unless ``handler`` can be called as a python agent calls it."""
    if not callable(handler):
        raise TypeError(f"{handler!r} is not callable")
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return  # a builtin or C function without a signature: called as documented
    try:
        signature.bind({}, idempotency_key="k", deadline=datetime.now(UTC), step="s", attempt=1)
    except TypeError as exc:
        raise TypeError(
            f"{getattr(handler, '__qualname__', handler)!r} must accept (order, *, "
            f"idempotency_key, deadline, step, attempt): {exc}"
        ) from None


class PythonTry:
    """Tries that call ``handler`` on a thread of its own (``agents.outcomes.TryKind``)."""

    def __init__(
        self,
        handler: Handler,
        *,
        name: str = "python",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        check_handler(handler)
        self.handler = handler
        self.name = name
        self._clock = clock
        self.lease_seconds = HANDLER_LEASE_SECONDS
        self._running: dict[str, concurrent.futures.Future[Try]] = {}
        self._running_lock = threading.Lock()

    def endpoint(self, path: str) -> str:
        return f"python agent {self.name}: {path}"

    def close(self) -> None:
        """Nothing to close: a running handler cannot be stopped, and finishes on its own."""

    @property
    def running(self) -> int:
        """Handler calls still running (some may have outlived their tries)."""
        with self._running_lock:
            return len(self._running)

    async def run(self, request: AgentRequest, timeout: float, slot: Slot | None = None) -> Try:
        key = request.idempotency_key
        deadline = self._clock() + timedelta(seconds=timeout)
        with self._running_lock:
            future = self._running.get(key)
            joined = future is not None
            if future is None:
                future = self._running[key] = self._start(request, deadline, slot)
        if future.done():  # it ended already (a run an earlier try started)
            return future.result()
        try:
            # Awaited on the caller's loop: the handler's thread is its own, and the attempt
            # holds none while it waits (a run outlives its try: never cancelled, shielded).
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout)
        except TimeoutError:
            METRICS.inc("python_agent_overruns")
            return Try(
                Applied.MAYBE,
                True,
                f"{request.step}: the handler "
                + ("(a run started by an earlier try) " if joined else "")
                + f"is still running after {timeout:.1f} s: it may have applied "
                "(it runs on; a retry waits for it rather than starting another)",
                # what this attempt reports follows this run
                running=_Running(future, self._clock, self.lease_seconds, key),
            )

    def _start(
        self, request: AgentRequest, deadline: datetime, slot: Slot | None
    ) -> concurrent.futures.Future[Try]:
        future: concurrent.futures.Future[Try] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        if slot is not None:
            slot.hold()  # until the handler returns, however long after its try
        order = copy.deepcopy(request.order or {})
        key, step = request.idempotency_key, request.step

        def run() -> None:
            try:
                value = self.handler(
                    order,
                    idempotency_key=key,
                    deadline=deadline,
                    step=step,
                    attempt=request.attempt,
                )
                outcome = Try(Applied.YES, False, result=_result(value))
            except NotApplied as exc:
                outcome = Try(
                    Applied.NO,
                    True,
                    f"{step}: not applied: {_text(exc.reason)}",
                    retry_after=_retry_after(exc.retry_after),
                )
            except Refused as exc:
                # The handler is the service: its refusal of the key settles, as a 422 does.
                outcome = Try(
                    Applied.NO, False, f"{step}: refused: {_text(exc.reason)}", settles=True
                )
            except BaseException as exc:  # any other end: it may have applied
                log.warning("handler of %s raised %s", step, type(exc).__name__, exc_info=True)
                outcome = Try(
                    Applied.MAYBE,
                    True,
                    f"{step}: {type(exc).__name__}: {_text(str(exc))} (may have applied)",
                )
            finally:
                with self._running_lock:
                    if self._running.get(key) is future:
                        del self._running[key]
                if slot is not None:
                    slot.release()
            future.set_result(outcome)

        # The handler's logs carry the order, step and attempt, as the agent's do.
        context = contextvars.copy_context()
        threading.Thread(
            target=context.run, args=(run,), name=f"handler-{self.name}-{key}", daemon=True
        ).start()
        return future


def _result(value: Any) -> dict[str, Any]:
    """The step's result: a dict as it is, None as {}, anything else as ``{"value": v}``;
    values JSON cannot carry (dates, decimals, ...) as their text."""
    body = {} if value is None else value if isinstance(value, dict) else {"value": value}
    try:
        out = json.loads(json.dumps(body, default=str))
    except (TypeError, ValueError, RecursionError) as exc:
        return {"unserializable": True, "reason": str(exc)[:300], "preview": repr(value)[:2000]}
    return out if isinstance(out, dict) else {"value": out}


def _retry_after(value: Any) -> float | None:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def _text(reason: Any) -> str:
    return str(reason)[:_REASON_CHARS]

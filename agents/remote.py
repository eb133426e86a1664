"""A resilient client for the remote services of docs/contracts.md §3.4, and what each try did
(docs/contracts.md §3.11).

(Over 400 lines: the classification of a try, its deadline and the retry loop decide
together what an attempt reports; endpoint health is already its own module.)

``POST {base}/{path}`` with the order's JSON and ``Idempotency-Key: <orderId>:<step>``
(the same on every try and every attempt, so the service applies the effect once
however often it is asked).

- Deadline: the agent must report before the step's ``CompleteBy``, so it stops trying
  a margin before it (a fifth of the time it had, 0.5-5 s). Each try is bounded as a
  whole (connect, send, and every byte of the answer) by the time left: httpx's own
  timeouts bound each read, not the request, so tries run on a background event loop
  under ``asyncio.timeout``.
- Each try is classified: *applied* (2xx), *refused* (3xx and 4xx but 408, 409, 425,
  429: nothing applied by it, not retried; only the service's own refusal of the key,
  400 or 422, also settles what earlier attempts did), *not applied* (408, 425, 429,
  503, or the connection failed before the request was sent), *may have applied*
  (other 5xx, 409 "key in use", or no answer to a request that was sent). The
  transient ones are retried with equal-jitter exponential backoff; ``Retry-After``
  is honoured but never shortens the backoff (``0`` or a past date cannot make tries
  come faster), and one that reaches past the deadline ends the attempt as a
  deferral (the remote is never called before the time it asked for).
- ``agents.health``: one breaker per remote endpoint decides whether a call may go out
  and whether a failed attempt is this order's failure (``transient``, counted) or
  the endpoint's (``deferred``, not counted).
- ``agents.auth``: the credentials of each try (API key, Entra token), got inside the
  try (none to be had: applied nothing, not sent); a 401 with a token gets a fresh one
  and sends again, once.
- ``agents.limits``: at most ``concurrency`` attempts at once; one that gets no slot
  while a try could still start is ``deferred``, not called.

Other kinds of agent (``agents.python``) subclass this client and replace ``_try``:
the loop, the breaker and the classification stay one copy.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import random
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar

import httpx

from agents.auth import CredentialError, NoHeaders, RequestAuth
from agents.health import EndpointHealth, HealthPolicy, HostActivity, Mark
from agents.limits import CallSlots
from core.messages import AgentRequest, Applied
from core.timefmt import iso
from observability import telemetry
from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)

TRANSIENT_4XX = frozenset({408, 425, 429})
#: Statuses that say the request was not processed (docs/contracts.md §3.11): timeout before
#: processing, too early, throttled, unavailable.
NOT_APPLIED_STATUSES = frozenset({408, 425, 429, 503})
#: The key is in use: an earlier call with it may still be running at the service. Not a
#: refusal: transient, and it may apply (docs/contracts.md §3.11).
KEY_IN_USE = 409
#: Refusals the service makes after looking the idempotency key up: they settle whether
#: the key's effect exists (docs/contracts.md §3.11). Every other refusal (401, 403, 404,
#: 405, 407, 413, 415, 431, 3xx ...) may come from a layer in front of the service
#: (gateway, auth, routing) and says nothing about the key.
SETTLING_STATUSES = frozenset({400, 422})
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
#: A longer Retry-After is read as this long: any wait must fit in a datetime.
MAX_RETRY_AFTER_SECONDS = 24 * 3600.0
#: Exceptions raised before the request left: nothing can have been applied.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)

T = TypeVar("T")


@dataclass(frozen=True)
class RemotePolicy:
    max_try_seconds: float = 10.0  # no single try waits longer than this
    connect_seconds: float = 3.0
    #: Stop trying this long before CompleteBy, so the report arrives in time: a
    #: fraction of the time the agent had, clamped.
    reply_margin_fraction: float = 0.2
    reply_margin_min_seconds: float = 0.5
    reply_margin_max_seconds: float = 5.0
    #: No try starts with less time than this before the stop time (see ``call``).
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
class Try:
    """One HTTP try: what it did, as far as the caller can know."""

    applied: Literal["yes", "no", "maybe"]
    retryable: bool
    error: str = ""
    status: int | None = None
    retry_after: float | None = None
    result: dict[str, Any] | None = None
    #: a refusal by the service itself after it looked the key up (400, 422)
    settles: bool = False
    #: the endpoint answered for itself (it is up), though this try failed (409)
    answered: bool = False


@dataclass(frozen=True)
class CallOutcome:
    """How one attempt ended: the agent turns it into its reply."""

    kind: Literal["succeeded", "refused", "transient", "deferred"]
    result: dict[str, Any] | None = None
    error: str = ""
    applied: Applied = "no"
    not_before: datetime | None = None
    tries: int = 0
    #: refused by the service after it looked the key up: settles earlier attempts' doubt
    settled: bool = False
    #: a call of this attempt runs on past it (a Python handler): the agent reports it,
    #: and its outcome when it ends
    running: Running | None = None


class Running(Protocol):
    """A call that outlived its attempt (``agents.python``)."""

    #: names this run in the reports about it (its end clears only its own hold)
    runner: str

    def until(self) -> datetime:
        """How long a report of it holds its step's compensation (renewed while it runs)."""
        ...

    def watch(self, heartbeat: Callable[[datetime], None], ended: Callable[[Try], None]) -> None:
        """Call ``heartbeat`` while it runs (each renews the hold), then ``ended`` with
        what it did; on a thread of its own."""
        ...


def _retry_after(response: httpx.Response, now: datetime) -> float | None:
    """Seconds from ``now`` the service asks us to wait; None if absent or unreadable."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None  # not a number, not an HTTP date: ignore it, back off as usual
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - now).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def classify(response: httpx.Response, path: str, now: datetime | None = None) -> Try:
    """What an HTTP answer says (docs/contracts.md §3.4 and §3.11)."""
    status = response.status_code
    if 200 <= status < 300:
        try:
            body = response.json()
        except Exception:  # noqa: BLE001 - whatever the remote sent: it still succeeded
            return Try(
                "yes", False, status=status, result={"status": status, "text": response.text[:1000]}
            )
        return Try(
            "yes", False, status=status, result=body if isinstance(body, dict) else {"value": body}
        )
    detail = ""
    try:
        body = response.json()
        if isinstance(body, dict):
            detail = str(body.get("error") or body.get("message") or "")[:300]
    except Exception:  # noqa: BLE001 - not JSON, too deep, not text: show what it is
        detail = response.text[:300]
    text = f"{path}: HTTP {status}" + (f" {detail}" if detail else "")
    if status in TRANSIENT_4XX or status >= 500 or status == KEY_IN_USE:
        return Try(
            "no" if status in NOT_APPLIED_STATUSES else "maybe",
            True,
            text + (" (the key is in use: an earlier call may still run)" if status == 409 else ""),
            status,
            _retry_after(response, now or datetime.now(UTC)),
            answered=status == KEY_IN_USE,
        )
    # Any other answer (3xx, 4xx): refused, nothing applied by this try; only the
    # service's own refusal of the key (400, 422) settles what earlier tries did.
    return Try("no", False, text, status, settles=status in SETTLING_STATUSES)


class _LoopThread:
    """One asyncio loop on a daemon thread: calls from any thread, each with a hard bound."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], bound: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=bound)
        except TimeoutError:
            future.cancel()  # the call must not outlive its attempt
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class RemoteServiceClient:
    def __init__(
        self,
        base_url: str,
        policy: RemotePolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        *,
        auth: RequestAuth | None = None,
        concurrency: int | None = None,
    ):
        self._base_url = base_url.rstrip("/")
        self.auth: RequestAuth = auth or NoHeaders()
        #: None: no limit of its own (the host's concurrency limits it).
        self.slots = CallSlots(concurrency) if concurrency is not None else None
        self.policy = policy or RemotePolicy()
        self._transport = transport
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._health: dict[str, EndpointHealth] = {}
        self._host = HostActivity()  # every endpoint here shares the base URL's host
        self._lock = threading.Lock()
        self._loop: _LoopThread | None = None
        self._http: httpx.AsyncClient | None = None

    def health(self, path: str) -> EndpointHealth:
        with self._lock:
            if path not in self._health:
                self._health[path] = EndpointHealth(
                    f"{self._base_url}/{path}", self.policy.health, self._host
                )
            return self._health[path]

    # --- one attempt ----------------------------------------------------------------

    def call(self, request: AgentRequest) -> CallOutcome:
        """The remote call for one attempt, tried until it succeeds, is refused, is
        deferred, or time runs out. Never raises for what the remote does."""
        path = request.path
        if (unsendable := _unsendable(request)) is not None:
            # Refused here, before any admission: the endpoint was not asked, so this
            # says nothing about its health (and must not close an open breaker).
            return CallOutcome("refused", error=unsendable)
        now = self._clock()
        left = (request.complete_by - now).total_seconds()
        stop_at = request.complete_by - timedelta(seconds=self.policy.reply_margin(left))
        if self.slots is None:
            return self._attempt(request, stop_at)
        # A slot must come while a try could still start (see the loop's first test).
        wait = (stop_at - now).total_seconds() - self.policy.min_try_seconds
        slot = self.slots.take(wait)
        if slot is None:
            METRICS.inc("agent_busy_deferrals")
            return CallOutcome(
                "deferred",
                error=f"{path}: all {self.slots.limit} call slots of this agent on this "
                f"instance stayed busy for {max(wait, 0):.1f} s, until too little time was "
                "left for a call; not called (concurrency limit)",
                not_before=self._clock(),
            )
        self.slots.current = slot
        try:
            return self._attempt(request, stop_at)
        finally:
            self.slots.current = None
            slot.release()

    def _attempt(self, request: AgentRequest, stop_at: datetime) -> CallOutcome:
        key, path = request.idempotency_key, request.path
        health = self.health(path)
        tries: list[Try] = []
        mark: Mark | None = None  # what had answered before this attempt's first failing try
        while True:
            now = self._clock()
            budget = (stop_at - now).total_seconds()
            if budget <= 0 or budget < self.policy.min_try_seconds:
                # Too little time for an answer: a try cut this short would only turn a
                # call into "may have applied". Not starting it is honest: not applied.
                break
            admission = health.admit(
                key, now.timestamp(), singled_out=request.singled_out or mark is not None
            )
            if not admission.allowed:
                METRICS.inc("breaker_deferrals")
                when = datetime.fromtimestamp(admission.retry_at, UTC)
                return self._deferred(
                    f"{path}: circuit open ({admission.reason}); not calling it before {iso(when)}",
                    when,
                    tries,
                )
            # Taken before the try: a success elsewhere while this try hangs also shows the
            # endpoint serving others.
            before = health.mark()
            attempt = self._try(request, min(budget, self.policy.max_try_seconds))
            now = self._clock()
            if attempt.applied == "yes":
                health.record_answer(key, now.timestamp())
                return CallOutcome("succeeded", result=attempt.result, tries=len(tries) + 1)
            if not attempt.retryable:
                health.record_answer(key, now.timestamp())
                # Refused now; an earlier try of this attempt may still have applied.
                return CallOutcome(
                    "refused",
                    error=attempt.error,
                    applied=_applied(tries),
                    tries=len(tries) + 1,
                    settled=attempt.settles,
                )
            if mark is None:
                mark = before
            if attempt.answered:
                health.record_answer(key, now.timestamp())  # up, and busy with this key
            else:
                health.record_failure(
                    key,
                    now.timestamp(),
                    explained=request.singled_out or health.successes > mark.endpoint,
                    probe=admission.probe,
                )
            tries.append(attempt)
            # Retry-After may ask for longer than the backoff, never for less: "0" or a
            # date in the past must not make tries come faster (docs/contracts.md §3.11).
            wait = max(attempt.retry_after or 0.0, self._backoff(len(tries)))
            left_after_wait = (stop_at - now).total_seconds() - wait
            if left_after_wait <= 0 or left_after_wait < self.policy.min_try_seconds:
                if attempt.retry_after is not None and attempt.retry_after >= wait:
                    return self._deferred(
                        f"{attempt.error}; the service asked to wait {wait:.0f} s (Retry-After), "
                        "past the step's deadline",
                        now + timedelta(seconds=wait),
                        tries,
                    )
                break
            METRICS.inc("remote_retries")
            log.info(
                "remote call failed (try %d), retrying in %.2f s: %s",
                len(tries),
                wait,
                attempt.error,
            )
            self._sleep(wait)
        now = self._clock()
        if not tries:
            return CallOutcome(
                "deferred", error="no time left to call before the deadline", not_before=now
            )
        if health.blames(key, mark=mark, singled_out=request.singled_out):
            return CallOutcome(
                "transient", error=tries[-1].error, applied=_applied(tries), tries=len(tries)
            )
        return self._deferred(
            f"{tries[-1].error}; {path} is failing for other orders too, or has served none "
            "since: waiting for it rather than counting it against this order",
            datetime.fromtimestamp(health.next_probe_at(now.timestamp()), UTC),
            tries,
        )

    def _deferred(self, reason: str, not_before: datetime, tries: list[Try]) -> CallOutcome:
        return CallOutcome(
            "deferred",
            error=reason,
            applied=_applied(tries),
            not_before=not_before,
            tries=len(tries),
        )

    def _backoff(self, failures: int) -> float:
        """Equal jitter: uniform in [high/2, high], high = min(max, initial * 2^(failures-1)).
        (Full jitter could draw a wait near 0 try after try.)"""
        high = min(
            self.policy.backoff_max_seconds,
            self.policy.backoff_initial_seconds * 2 ** min(failures - 1, 30),
        )
        return self._rng.uniform(high / 2, high)

    # --- one try --------------------------------------------------------------------

    def _try(self, request: AgentRequest, timeout: float) -> Try:
        try:
            body = json.dumps(request.order, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            return Try("no", False, f"{request.path}: the order cannot be sent as JSON ({exc})")
        # Only W3C trace context travels from the message, and never over the contract's key.
        headers = {
            k: v for k, v in (telemetry.carrier() or request.trace).items() if k in TRACE_HEADERS
        }
        headers["Idempotency-Key"] = request.idempotency_key
        headers["Content-Type"] = "application/json"
        # No compressed answers: a body that fails to decompress would hide the status.
        headers["Accept-Encoding"] = "identity"
        path, content = request.path, body.encode("utf-8")
        started = time.monotonic()  # the try's timeout bounds it whole, credentials included

        def left() -> float:
            return timeout - (time.monotonic() - started)

        try:
            credentials = self.auth.headers(timeout)
        except CredentialError as exc:
            return Try("no", True, f"{path}: {exc}; the request was not sent")
        answer = self._send(path, content, headers, credentials, left() if credentials else timeout)
        if isinstance(answer, httpx.Response) and answer.status_code == 401:
            # A stale or revoked token: one fresh token, one more send, in this try.
            try:
                if self.auth.refresh(answer.headers.get("WWW-Authenticate"), left(), credentials):
                    credentials = self.auth.headers(left())
                    answer = self._send(path, content, headers, credentials, left())
            except CredentialError as exc:
                return Try("no", True, f"{path}: HTTP 401, and no fresh token to send again: {exc}")
        if isinstance(answer, Try):
            return answer
        # Parsed here, on the caller's thread: a large body must not stall the shared loop.
        outcome = classify(answer, path, self._clock())
        if answer.status_code in (401, 403) and not isinstance(self.auth, NoHeaders):
            outcome = replace(
                outcome,
                error=f"{outcome.error} (the remote refused this agent's credentials)",
            )
        return outcome

    def _send(
        self,
        path: str,
        content: bytes,
        headers: dict[str, str],
        credentials: dict[str, str],
        timeout: float,
    ) -> Try | httpx.Response:
        # Credentials never replace the contract's headers (the key, the body's type).
        own = {k.lower() for k in headers}
        headers = {**{k: v for k, v in credentials.items() if k.lower() not in own}, **headers}
        if timeout <= 0:
            return Try("no", True, f"{path}: no time left to send (the request was never sent)")
        loop = self._event_loop()
        try:
            return loop.run(
                self._post(f"{self._base_url}/{path}", content, headers, timeout, path),
                bound=timeout + 5,
            )
        except TimeoutError:  # pragma: no cover - the coroutine bounds itself first
            return Try("maybe", True, f"{path}: no answer within {timeout:.1f} s")

    async def _post(
        self, url: str, content: bytes, headers: dict[str, str], timeout: float, path: str
    ) -> Try | httpx.Response:
        sent = False

        async def trace(event: str, info: dict[str, Any]) -> None:
            nonlocal sent
            if ".send_request_headers." in event:
                sent = True

        http = self._async_client()
        try:
            async with asyncio.timeout(timeout):
                response = await http.post(
                    url,
                    content=content,
                    headers=headers,
                    timeout=httpx.Timeout(
                        timeout, connect=min(timeout, self.policy.connect_seconds)
                    ),
                    extensions={"trace": trace},
                )
        except TimeoutError:
            return Try(
                "maybe" if sent else "no",
                True,
                f"{path}: no answer within {timeout:.1f} s"
                + ("" if sent else " (the request was never sent)"),
            )
        except _NOT_SENT as exc:
            return Try(
                "no", True, f"{path}: {type(exc).__name__}: {exc} (the request was never sent)"
            )
        except httpx.TimeoutException as exc:
            return Try(
                "maybe", True, f"{path}: no answer within {timeout:.1f} s ({type(exc).__name__})"
            )
        except httpx.TransportError as exc:
            return Try("maybe", True, f"{path}: {type(exc).__name__}: {exc}")
        except httpx.RequestError as exc:  # e.g. a body that cannot be decoded
            return Try("maybe" if sent else "no", True, f"{path}: {type(exc).__name__}: {exc}")
        return response

    def _event_loop(self) -> _LoopThread:
        with self._lock:
            if self._loop is None:
                self._loop = _LoopThread(f"remote-{id(self):x}")
            return self._loop

    def _async_client(self) -> httpx.AsyncClient:
        # Built on the loop's thread, on first use, and reused (one connection pool).
        if self._http is None:
            self._http = httpx.AsyncClient(
                transport=self._transport or httpx.AsyncHTTPTransport(retries=0),
                follow_redirects=False,
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
            )
        return self._http

    def close(self) -> None:
        self.auth.close()
        with self._lock:
            loop, http = self._loop, self._http
            self._loop = self._http = None
        if loop is not None:
            if http is not None:
                asyncio.run_coroutine_threadsafe(http.aclose(), loop.loop).result(timeout=5)
            loop.close()


def _unsendable(request: AgentRequest) -> str | None:
    """Why the order cannot be a JSON body, or None."""
    try:
        json.dumps(request.order, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        return f"{request.path}: the order cannot be sent as JSON ({exc})"
    return None


def _applied(tries: list[Try]) -> Applied:
    return "maybe" if any(t.applied == "maybe" for t in tries) else "no"

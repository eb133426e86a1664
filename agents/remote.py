"""A resilient client for the remote services of contract 3.4.

``POST {REMOTE_SERVICE_URL}/{path}`` with the order's JSON and the header
``Idempotency-Key: <orderId>:<step>`` (the same on every try and every
attempt, so the service applies the effect once however often we ask).

- Deadline: every try's timeout is bounded by the time left before the step's
  ``CompleteBy`` (less a margin for the reply to travel); no try starts after it.
- Retries (tenacity): transient failures only (408, 425, 429, 5xx, connection
  errors, timeouts), exponential backoff with full jitter, ``Retry-After``
  honoured (capped by the time left).
- Circuit breaker (``circuitbreaker``), one per remote endpoint: after
  repeated transient failures the endpoint is left alone for a while instead
  of being hammered; an open breaker is itself a transient failure, retried
  after it. (Not pybreaker: its ``call`` holds a lock for the whole call, so
  one hanging request would serialize every other call to that endpoint.)
- Permanent failures (any other 4xx) are not retried and do not trip the breaker.
"""

from __future__ import annotations

import email.utils
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from circuitbreaker import CircuitBreaker
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_random_exponential,
)

from core.errors import DeadlineExceeded, RemoteCallFailed
from core.messages import AgentRequest
from runtime import telemetry
from runtime.logs import get_logger
from runtime.metrics import METRICS

log = get_logger(__name__)

TRANSIENT_STATUSES = frozenset({408, 425, 429})
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})


@dataclass(frozen=True)
class RemotePolicy:
    max_try_seconds: float = 10.0  # no single try waits longer than this
    connect_seconds: float = 3.0
    reply_margin_seconds: float = 0.5  # stop this long before CompleteBy: the reply must travel
    backoff_initial_seconds: float = 0.2
    backoff_max_seconds: float = 5.0
    breaker_fail_max: int = 5
    breaker_reset_seconds: float = 10.0


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
    return max(seconds, 0.0)


def _is_transient(exc_type: type[BaseException], exc: BaseException) -> bool:
    return isinstance(exc, RemoteCallFailed) and exc.retryable


def classify(
    response: httpx.Response, path: str, now: datetime | None = None
) -> RemoteCallFailed | None:
    """None for 2xx; otherwise the failure, transient or permanent per contract 3.4."""
    status = response.status_code
    if 200 <= status < 300:
        return None
    detail = ""
    try:
        body = response.json()
        if isinstance(body, dict):
            detail = str(body.get("error") or body.get("message") or "")
    except ValueError:
        detail = response.text[:300]
    text = f"{path}: HTTP {status}" + (f" {detail}" if detail else "")
    if status in TRANSIENT_STATUSES or status >= 500:
        return RemoteCallFailed(
            text,
            retryable=True,
            status=status,
            retry_after=_retry_after(response, now or datetime.now(UTC)),
        )
    return RemoteCallFailed(text, retryable=False, status=status)


class RemoteServiceClient:
    def __init__(
        self,
        base_url: str,
        policy: RemotePolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], None] = time.sleep,
    ):
        self._base_url = base_url.rstrip("/")
        self.policy = policy or RemotePolicy()
        self._http = httpx.Client(
            transport=transport,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )
        self._clock = clock
        self._sleep = sleep
        self._breakers: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()

    def breaker(self, path: str) -> CircuitBreaker:
        with self._lock:
            if path not in self._breakers:
                self._breakers[path] = CircuitBreaker(
                    failure_threshold=self.policy.breaker_fail_max,
                    recovery_timeout=self.policy.breaker_reset_seconds,
                    # Only the endpoint's health counts: a 4xx is about our request.
                    expected_exception=_is_transient,
                    name=path,
                )
            return self._breakers[path]

    def call(self, request: AgentRequest) -> dict[str, Any]:
        """The remote call for one attempt; raises ``RemoteCallFailed`` (permanent) or
        ``DeadlineExceeded`` (time is up: the caller sends nothing)."""
        deadline = request.complete_by.timestamp() - self.policy.reply_margin_seconds
        budget = deadline - self._clock().timestamp()
        if budget <= 0:
            raise DeadlineExceeded(
                "no time left before the deadline", order_id=request.order_id, step=request.step
            )

        def out_of_time(state: RetryCallState) -> bool:
            # On our clock (not tenacity's monotonic one): stop when the next wait would end
            # at or after the deadline, so no try ever starts too late to reply in time.
            return self._clock().timestamp() + (state.upcoming_sleep or 0.0) >= deadline

        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, RemoteCallFailed) and e.retryable),
            wait=self._wait,
            stop=out_of_time,
            sleep=self._sleep,
            reraise=True,
            before_sleep=self._before_sleep,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return self._try(request, deadline)
        except RemoteCallFailed as exc:
            if exc.retryable:
                raise DeadlineExceeded(
                    f"still failing when time ran out: {exc}",
                    order_id=request.order_id,
                    step=request.step,
                ) from exc
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait(self, state: RetryCallState) -> float:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        backoff = wait_random_exponential(
            multiplier=self.policy.backoff_initial_seconds, max=self.policy.backoff_max_seconds
        )(state)
        if isinstance(exc, RemoteCallFailed) and exc.retry_after is not None:
            return max(float(exc.retry_after), 0.0)
        return float(backoff)

    def _before_sleep(self, state: RetryCallState) -> None:
        METRICS.inc("remote_retries")
        exc = state.outcome.exception() if state.outcome is not None else None
        log.info("remote call failed (try %d), retrying: %s", state.attempt_number, exc)

    def _try(self, request: AgentRequest, deadline: float) -> dict[str, Any]:
        left = deadline - self._clock().timestamp()
        if left <= 0:
            raise DeadlineExceeded(
                "no time left for another try", order_id=request.order_id, step=request.step
            )
        timeout = min(left, self.policy.max_try_seconds)
        breaker = self.breaker(request.path)
        if breaker.opened:
            METRICS.inc("breaker_open")
            raise RemoteCallFailed(
                f"{request.path}: circuit open after {breaker.failure_count} failures in a row; "
                f"not calling it for {breaker.open_remaining:.1f} s",
                retryable=True,
                retry_after=max(min(float(breaker.open_remaining), left), 0.05),
                order_id=request.order_id,
                step=request.step,
            )
        with breaker:
            return self._post(request, timeout)

    def _post(self, request: AgentRequest, timeout: float) -> dict[str, Any]:
        url = f"{self._base_url}/{request.path}"
        # Only W3C trace context travels from the message, and never over the contract's key.
        headers = {
            k: v for k, v in (telemetry.carrier() or request.trace).items() if k in TRACE_HEADERS
        }
        headers["Idempotency-Key"] = request.idempotency_key
        try:
            body = json.dumps(request.order, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise RemoteCallFailed(
                f"{request.path}: the order cannot be sent as JSON ({exc})", retryable=False
            ) from exc
        headers["Content-Type"] = "application/json"
        try:
            response = self._http.post(
                url,
                content=body.encode("utf-8"),
                headers=headers,
                timeout=httpx.Timeout(timeout, connect=min(timeout, self.policy.connect_seconds)),
            )
        except httpx.TimeoutException as exc:
            raise RemoteCallFailed(
                f"{request.path}: no answer within {timeout:.1f} s", retryable=True
            ) from exc
        except httpx.TransportError as exc:
            raise RemoteCallFailed(
                f"{request.path}: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        failure = classify(response, request.path, self._clock())
        if failure is not None:
            raise failure
        try:
            body = response.json()
        except ValueError:
            return {"status": response.status_code, "text": response.text[:1000]}
        return body if isinstance(body, dict) else {"value": body}

    def close(self) -> None:
        self._http.close()

"""The HTTP kind of try: one call of a remote service of docs/contracts.md §3.4, and what
it did (docs/contracts.md §3.11). ``agents.runner`` runs the attempt around it.

``POST {base}/{path}`` with the order's JSON and ``Idempotency-Key: <orderId>:<step>``
(the same on every try and every attempt, so the service applies the effect once
however often it is asked).

- A try is awaited on the caller's event loop (the agent's function is ``async``: a try
  that waits for a slow remote holds a coroutine, not a thread) and bounded as a whole
  (connect, send, and every byte of the answer) by its timeout, under
  ``asyncio.timeout``: httpx's own timeouts bound each read, not the request.
- Each try is classified (``classify``): *applied* (2xx), *refused* (3xx and 4xx but
  408, 409, 425, 429: nothing applied by it, not retried; only the service's own
  refusal of the key, 400 or 422, also settles what earlier attempts did), *not
  applied* (408, 425, 429, 503, or the connection failed before the request was sent),
  *may have applied* (other 5xx, 409 "key in use", or no answer to a request that was
  sent). ``Retry-After`` is read (seconds or an HTTP date) for the runner's pacing.
- ``agents.auth``: the credentials of each try (API key, Entra token), got inside the
  try (none to be had: applied nothing, not sent); a 401 with a token gets a fresh one
  and sends again, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

import httpx

from agents.auth import CredentialError, NoHeaders, RequestAuth
from agents.limits import Slot
from agents.outcomes import Try
from core.messages import AgentRequest
from core.outcome import Applied
from observability import telemetry

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

#: An answer larger than this is read on a thread, off the event loop.
LARGE_ANSWER_BYTES: Final = 256 * 1024


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
                Applied.YES,
                False,
                status=status,
                result={"status": status, "text": response.text[:1000]},
            )
        return Try(
            Applied.YES,
            False,
            status=status,
            result=body if isinstance(body, dict) else {"value": body},
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
            Applied.NO if status in NOT_APPLIED_STATUSES else Applied.MAYBE,
            True,
            text + (" (the key is in use: an earlier call may still run)" if status == 409 else ""),
            status,
            _retry_after(response, now or datetime.now(UTC)),
            answered=status == KEY_IN_USE,
        )
    # Any other answer (3xx, 4xx): refused, nothing applied by this try; only the
    # service's own refusal of the key (400, 422) settles what earlier tries did.
    return Try(Applied.NO, False, text, status, settles=status in SETTLING_STATUSES)


class HttpTry:
    """Tries over HTTP against one base URL (``agents.outcomes.TryKind``)."""

    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        auth: RequestAuth | None = None,
        connect_seconds: float = 3.0,
    ):
        self._base_url = base_url.rstrip("/")
        self.auth: RequestAuth = auth or NoHeaders()
        self._transport = transport
        self._clock = clock
        self._connect_seconds = connect_seconds
        self._lock = threading.Lock()
        #: one client (one connection pool) per event loop: in the runtime there is one
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._clients = weakref.WeakKeyDictionary()

    def endpoint(self, path: str) -> str:
        return f"{self._base_url}/{path}"

    async def run(self, request: AgentRequest, timeout: float, slot: Slot | None = None) -> Try:
        try:
            body = json.dumps(request.order, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            return Try(
                Applied.NO, False, f"{request.path}: the order cannot be sent as JSON ({exc})"
            )
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
            credentials = await self.auth.headers(timeout)
        except CredentialError as exc:
            return Try(Applied.NO, True, f"{path}: {exc}; the request was not sent")
        answer = await self._send(
            path, content, headers, credentials, left() if credentials else timeout
        )
        if isinstance(answer, httpx.Response) and answer.status_code == 401:
            # A stale or revoked token: one fresh token, one more send, in this try.
            try:
                challenge = answer.headers.get("WWW-Authenticate")
                if await self.auth.refresh(challenge, left(), credentials):
                    credentials = await self.auth.headers(left())
                    answer = await self._send(path, content, headers, credentials, left())
            except CredentialError as exc:
                return Try(
                    Applied.NO, True, f"{path}: HTTP 401, and no fresh token to send again: {exc}"
                )
        if isinstance(answer, Try):
            return answer
        if len(answer.content) > LARGE_ANSWER_BYTES:
            # A large body is parsed on a thread: it must not stall the runtime's event loop,
            # which every async invocation of the instance shares.
            outcome = await asyncio.to_thread(classify, answer, path, self._clock())
        else:
            outcome = classify(answer, path, self._clock())
        if answer.status_code in (401, 403) and not isinstance(self.auth, NoHeaders):
            outcome = replace(
                outcome,
                error=f"{outcome.error} (the remote refused this agent's credentials)",
            )
        return outcome

    async def _send(
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
            return Try(
                Applied.NO, True, f"{path}: no time left to send (the request was never sent)"
            )
        return await self._post(f"{self._base_url}/{path}", content, headers, timeout, path)

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
                    timeout=httpx.Timeout(timeout, connect=min(timeout, self._connect_seconds)),
                    extensions={"trace": trace},
                )
        except TimeoutError:
            return Try(
                Applied.MAYBE if sent else Applied.NO,
                True,
                f"{path}: no answer within {timeout:.1f} s"
                + ("" if sent else " (the request was never sent)"),
            )
        except _NOT_SENT as exc:
            return Try(
                Applied.NO,
                True,
                f"{path}: {type(exc).__name__}: {exc} (the request was never sent)",
            )
        except httpx.TimeoutException as exc:
            return Try(
                Applied.MAYBE,
                True,
                f"{path}: no answer within {timeout:.1f} s ({type(exc).__name__})",
            )
        except httpx.TransportError as exc:
            return Try(Applied.MAYBE, True, f"{path}: {type(exc).__name__}: {exc}")
        except httpx.RequestError as exc:  # e.g. a body that cannot be decoded
            return Try(
                Applied.MAYBE if sent else Applied.NO, True, f"{path}: {type(exc).__name__}: {exc}"
            )
        return response

    async def probe(self, path: str, timeout: float) -> tuple[bool, str]:
        """The agent's health probe (``agents.healthcheck``): ``GET {base}/{path}`` with
        the agent's credentials, bounded as a whole by ``timeout``; (a 2xx, what it said).
        The body is not read: the status is the answer."""
        url = f"{self._base_url}/{path.lstrip('/')}"
        what = f"GET {path}"
        started = time.monotonic()
        try:
            credentials = await self.auth.headers(timeout)
        except CredentialError as exc:
            return False, f"{what}: {exc}; not sent"
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            return False, f"{what}: no time left to send"
        headers = {**credentials, "Accept-Encoding": "identity"}
        http = self._async_client()
        try:
            async with (
                asyncio.timeout(left),
                http.stream(
                    "GET",
                    url,
                    headers=headers,
                    timeout=httpx.Timeout(left, connect=min(left, self._connect_seconds)),
                ) as response,
            ):
                status = response.status_code
        except TimeoutError:
            return False, f"{what}: no answer within {timeout:.1f} s"
        except httpx.HTTPError as exc:
            return False, f"{what}: {type(exc).__name__}: {exc}"
        return 200 <= status < 300, f"{what}: HTTP {status}"

    def _async_client(self) -> httpx.AsyncClient:
        # Built on first use on each loop, and reused there (one connection pool): an
        # AsyncClient's connections belong to the loop that opened them.
        loop = asyncio.get_running_loop()
        with self._lock:
            http = self._clients.get(loop)
            if http is None:
                http = self._clients[loop] = httpx.AsyncClient(
                    transport=self._transport or httpx.AsyncHTTPTransport(retries=0),
                    follow_redirects=False,
                    limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
                )
            return http

    def close(self) -> None:
        self.auth.close()
        with self._lock:
            clients = list(self._clients.items())
            self._clients.clear()
        for loop, http in clients:
            # Closed on its own loop, if that still runs (a loop that has ended took its
            # connections with it).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_close_on, loop, http)


def _close_on(loop: asyncio.AbstractEventLoop, http: httpx.AsyncClient) -> None:
    task = loop.create_task(http.aclose())
    _CLOSING.add(task)  # held until done: a task nobody holds may be collected unfinished
    task.add_done_callback(_CLOSING.discard)


_CLOSING: set[asyncio.Task[None]] = set()

"""The resilient remote client (docs/contracts.md §3.4 and §3.11) and the agent (3.3), on
httpx.MockTransport and a fake clock.

Nothing here sleeps for real: the fake ``sleep`` advances the fake clock. The only real
waits are the tests of the whole-try bound (a local server that trickles its answer or
never speaks, and async handlers that never answer), each bounded well under a second.
The breaker and the attribution of failures are in ``test_endpoint_health.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from agents.agent import REPLY_SEND_SECONDS, AgentWorker
from agents.outcomes import CallOutcome, Try
from agents.pacing import RemotePolicy
from agents.remote import HttpTry, classify
from agents.runner import AttemptRunner
from agents.threads import OwnThreads
from core.errors import DuplicateRequest, StorageUnavailable, UnboundMessage
from core.messages import MAX_RESULT_CHARS, AgentReply, AgentRequest
from core.outcome import Applied, Outcome
from core.timefmt import iso
from messaging.wire import decode_reply
from tests.support import unanswered

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
BASE = "http://remote.test/api"
ORDER = {"orderId": "o-1", "qty": 2, "note": "Zoë"}
KEY = "o-1:process"
#: A Storage queue message is at most 64 KiB.
QUEUE_MESSAGE_BYTES = 64 * 1024


class FakeClock:
    """A UTC clock that only moves when ``sleep`` (or a test) moves it."""

    def __init__(self, start: datetime = T0):
        self.now = start
        self.sleeps: list[float] = []
        #: Awaited after every sleep of an attempt (``asleep``): how a test runs something
        #: "meanwhile", on the same event loop, as the runtime would.
        self.on_sleep: list[Callable[[], Awaitable[None]]] = []

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def at(self, seconds: float) -> None:
        """Set the clock to T0 + ``seconds``."""
        self.now = T0 + timedelta(seconds=seconds)

    def sleep(self, seconds: float) -> None:
        # As strict as time.sleep, so a bad wait fails here as it would in production.
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"sleep length must be a non-negative number, got {seconds!r}")
        self.sleeps.append(seconds)
        self.advance(seconds)

    async def asleep(self, seconds: float) -> None:
        """``sleep`` for an attempt's runner, which awaits its waits (it is a coroutine)."""
        self.sleep(seconds)
        for hook in list(self.on_sleep):
            await hook()


class MaxRng(random.Random):
    """Jitter at its ceiling: every backoff is the longest allowed (deterministic)."""

    def __init__(self) -> None:
        super().__init__(0)
        self.bounds: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.bounds.append((a, b))
        return b


@dataclass
class Seen:
    method: str
    url: str
    body: Any
    idempotency_key: str | None
    headers: dict[str, str]
    timeout: dict[str, float]
    at: datetime


#: One try of the scripted remote: its answer, a transport error raised as httpx raises it
#: (with the request), or a function of the request.
Step = httpx.Response | type[httpx.RequestError] | Callable[[httpx.Request], httpx.Response]


@dataclass
class Remote:
    """A scripted remote service: one entry per try, the last one repeats; ``by_key``
    gives some idempotency keys (orders) their own script."""

    clock: FakeClock
    script: list[Step]
    by_key: dict[str, list[Step]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        key = request.headers.get("Idempotency-Key")
        self.seen.append(
            Seen(
                request.method,
                str(request.url),
                json.loads(request.content),
                key,
                dict(request.headers),
                dict(request.extensions["timeout"]),
                self.clock(),
            )
        )
        script = self.by_key.get(key or "", self.script)
        step = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(step, type):
            assert issubclass(step, httpx.RequestError), step
            raise step("simulated", request=request)
        if callable(step) and not isinstance(step, httpx.Response):
            return step(request)
        return step

    def calls(self, key: str | None = None) -> list[Seen]:
        return [s for s in self.seen if key is None or s.idempotency_key == key]


def remote(clock: FakeClock, *script: Step, **by_key: Sequence[Step]) -> Remote:
    return Remote(clock, list(script), {key: list(steps) for key, steps in by_key.items()})


def ok(body: Any = None) -> httpx.Response:
    return httpx.Response(200, json={"ok": True} if body is None else body)


def status(code: int, error: str = "busy", **headers: str) -> httpx.Response:
    return httpx.Response(code, json={"error": error}, headers=headers)


def make_request(
    seconds_left: float = 30,
    *,
    path: str = "process",
    step: str = "process",
    order_id: str = "o-1",
    **changes: Any,
) -> AgentRequest:
    fields: dict[str, Any] = {
        "order_id": order_id,
        "step": step,
        "attempt": 1,
        "complete_by": T0 + timedelta(seconds=seconds_left),
        "path": path,
        "order": ORDER,
    }
    fields.update(changes)
    return AgentRequest(**fields)


_CLIENTS: list[AttemptRunner[HttpTry]] = []


def make_client(
    remote: Remote,
    base: str = BASE,
    *,
    rng: random.Random | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    **policy: Any,
) -> tuple[AttemptRunner[HttpTry], FakeClock]:
    connect = policy.pop("connect_seconds", 3.0)
    client = AttemptRunner(
        HttpTry(
            base,
            transport=transport or httpx.MockTransport(remote),
            clock=remote.clock,
            connect_seconds=connect,
        ),
        RemotePolicy(**{"min_try_seconds": 0.0, **policy}),
        clock=remote.clock,
        sleep=remote.clock.asleep,
        rng=rng,
    )
    _CLIENTS.append(client)
    return client, remote.clock


def close_clients() -> None:
    while _CLIENTS:
        _CLIENTS.pop().close()


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    close_clients()


# --- the request on the wire ------------------------------------------------------------


def test_success_posts_the_order_with_the_idempotency_key_and_returns_the_json() -> None:
    r = remote(FakeClock(), ok({"reservation": "r-1", "lines": [1, 2]}))
    client, clock = make_client(r, base=BASE + "/")

    outcome = asyncio.run(client.call(make_request()))

    assert outcome == CallOutcome(
        Outcome.SUCCEEDED, result={"reservation": "r-1", "lines": [1, 2]}, tries=1
    )
    assert [(s.method, s.url, s.body, s.idempotency_key) for s in r.seen] == [
        ("POST", "http://remote.test/api/process", ORDER, KEY)
    ]
    assert r.seen[0].headers["content-type"] == "application/json"
    assert clock.sleeps == []


def test_the_path_names_the_remote_service() -> None:
    r = remote(FakeClock(), ok())
    client, _ = make_client(r)

    asyncio.run(client.call(make_request(path="stock/reserve", step="reserve-stock")))

    assert r.seen[0].url == "http://remote.test/api/stock/reserve"
    assert r.seen[0].idempotency_key == "o-1:reserve-stock"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (httpx.Response(201, json={"id": 7}), {"id": 7}),
        (httpx.Response(200, json=[1, 2]), {"value": [1, 2]}),
        (httpx.Response(204), {"status": 204, "text": ""}),
    ],
)
def test_any_2xx_is_success(response: httpx.Response, expected: dict[str, Any]) -> None:
    client, _ = make_client(remote(FakeClock(), response))

    outcome = asyncio.run(client.call(make_request()))

    assert (outcome.kind, outcome.result) == ("succeeded", expected)


def test_the_same_idempotency_key_on_every_try_and_every_attempt() -> None:
    r = remote(FakeClock(), status(503), status(502), ok())
    client, clock = make_client(r)

    assert asyncio.run(client.call(make_request(attempt=1))).kind == "succeeded"
    r.script = [status(500), ok()]
    assert asyncio.run(
        client.call(make_request(attempt=7, complete_by=clock.now + timedelta(seconds=30)))
    ).kind == ("succeeded")

    assert [s.idempotency_key for s in r.seen] == [KEY] * 5
    assert all(s.body == ORDER for s in r.seen)


def test_trace_context_travels_but_cannot_replace_the_idempotency_key() -> None:
    r = remote(FakeClock(), ok())
    client, _ = make_client(r)
    trace = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "congo=t61rcWkgMzE",
        "Idempotency-Key": "x",
        "idempotency-key": "y",
        "Authorization": "Bearer stolen",
    }

    asyncio.run(client.call(make_request(trace=trace)))

    headers = r.seen[0].headers
    assert headers["idempotency-key"] == KEY
    assert headers["traceparent"] == trace["traceparent"]
    assert headers["tracestate"] == trace["tracestate"]
    assert "authorization" not in headers


def test_an_unsendable_body_is_refused_without_calling_the_remote() -> None:
    r = remote(FakeClock(), ok())
    client, _ = make_client(r)
    poisoned = make_request(order={"orderId": "o-1", "price": float("nan")})

    for _ in range(3):
        outcome = asyncio.run(client.call(poisoned))
        assert outcome.kind == "refused"
        assert outcome.applied == "no"
        assert "cannot be sent as JSON" in outcome.error

    assert r.seen == []
    assert asyncio.run(client.call(make_request())).kind == "succeeded"


# --- what each try did (docs/contracts.md §3.11) -----------------------------------------------------


def one_try(step: Step, timeout: float = 5.0) -> Try:
    client, _ = make_client(remote(FakeClock(), step))
    return asyncio.run(client.kind.run(make_request(), timeout))


@pytest.mark.parametrize(
    ("code", "applied", "retryable"),
    [
        (200, "yes", False),
        (201, "yes", False),
        (204, "yes", False),
        (299, "yes", False),
        # answered "not processed": nothing applied, try again
        (408, "no", True),
        (425, "no", True),
        (429, "no", True),
        (503, "no", True),
        # other 5xx: the service may have done the work before failing
        (500, "maybe", True),
        (501, "maybe", True),
        (502, "maybe", True),
        (504, "maybe", True),
        (507, "maybe", True),
        (599, "maybe", True),
        # 409: the key is in use (an earlier call may still run): transient, may apply
        (409, "maybe", True),
        # other 4xx: refused, nothing applied, asking again cannot help
        (400, "no", False),
        (401, "no", False),
        (403, "no", False),
        (404, "no", False),
        (410, "no", False),
        (413, "no", False),
        (422, "no", False),
        (451, "no", False),
    ],
)
def test_every_status_is_classified(code: int, applied: str, retryable: bool) -> None:
    attempt = one_try(status(code, error="why"))

    assert (attempt.applied, attempt.retryable, attempt.status) == (applied, retryable, code)
    assert classify(status(code, error="why"), "process", T0).applied == applied
    if applied != "yes":
        assert attempt.error.startswith(f"process: HTTP {code} why")
    # Only the service's own refusal of the key settles what earlier tries did.
    assert attempt.settles is (code in (400, 422))


@pytest.mark.parametrize(
    ("error", "applied"),
    [
        # the request never left: nothing applied
        (httpx.ConnectError, "no"),
        (httpx.ConnectTimeout, "no"),
        (httpx.PoolTimeout, "no"),
        # sent, and the answer never came or the connection broke: may have applied
        (httpx.ReadTimeout, "maybe"),
        (httpx.WriteTimeout, "maybe"),
        (httpx.ReadError, "maybe"),
        (httpx.WriteError, "maybe"),
        (httpx.RemoteProtocolError, "maybe"),
        (httpx.LocalProtocolError, "maybe"),
    ],
)
def test_every_transport_error_is_classified(error: type[httpx.RequestError], applied: str) -> None:
    attempt = one_try(error)

    assert (attempt.applied, attempt.retryable, attempt.status) == (applied, True, None)
    assert attempt.error.startswith("process: ")


@pytest.mark.parametrize(
    ("script", "applied"),
    [
        ([status(503)], "no"),
        ([status(408), status(425), status(429), httpx.ConnectError, httpx.ConnectTimeout], "no"),
        ([status(503), status(500), status(503)], "maybe"),
        ([httpx.ConnectError, httpx.ReadTimeout, status(429)], "maybe"),
        ([httpx.PoolTimeout, httpx.RemoteProtocolError, httpx.ConnectError], "maybe"),
        ([status(502)], "maybe"),
    ],
)
def test_the_attempt_may_have_applied_if_any_try_may_have(script: list[Step], applied: str) -> None:
    r = remote(FakeClock(), *script)
    client, _ = make_client(r, rng=MaxRng())

    outcome = asyncio.run(client.call(make_request(seconds_left=30)))

    assert outcome.kind == "deferred"  # a lone order: see test_endpoint_health.py
    assert outcome.tries == len(r.seen) >= len(script)
    assert outcome.applied == applied


@pytest.mark.parametrize("code", [408, 425, 429, 500, 502, 503, 504])
def test_transient_statuses_are_retried(code: int) -> None:
    r = remote(FakeClock(), status(code), status(code), ok({"done": 1}))
    client, clock = make_client(r)

    outcome = asyncio.run(client.call(make_request()))

    assert (outcome.kind, outcome.result, outcome.tries) == ("succeeded", {"done": 1}, 3)
    assert len(r.seen) == 3
    assert len(clock.sleeps) == 2


@pytest.mark.parametrize(
    "error",
    [httpx.ConnectError, httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ConnectTimeout],
)
def test_connection_errors_and_timeouts_are_retried(error: type[httpx.RequestError]) -> None:
    r = remote(FakeClock(), error, ok({"done": 1}))
    client, clock = make_client(r)

    assert asyncio.run(client.call(make_request())).result == {"done": 1}
    assert len(r.seen) == 2
    assert len(clock.sleeps) == 1


@pytest.mark.parametrize("code", [301, 400, 401, 403, 404, 405, 407, 413, 415, 422, 431])
def test_other_4xx_are_refused_and_not_retried(code: int) -> None:
    r = remote(FakeClock(), status(code, error="out of stock"), ok())
    client, clock = make_client(r)

    outcome = asyncio.run(client.call(make_request()))

    assert outcome == CallOutcome(
        Outcome.REFUSED,
        error=f"process: HTTP {code} out of stock",
        applied=Applied.NO,
        tries=1,
        settled=code in (400, 422),  # the others may come from a gateway, not the service
    )
    assert len(r.seen) == 1
    assert clock.sleeps == []


def test_a_refusal_without_json_carries_the_text() -> None:
    client, _ = make_client(remote(FakeClock(), httpx.Response(400, text="sku missing")))

    assert asyncio.run(client.call(make_request())).error == "process: HTTP 400 sku missing"


# --- the whole-try bound: real waits, sub-second -------------------------------------------


class LocalServer:
    """A real HTTP server on 127.0.0.1 that misbehaves in one of two ways.

    ``trickle``: reads the request, answers the status line and headers at once, then one
    body byte every ``gap`` seconds, forever (so no single read ever times out).
    ``silent``: accepts the connection and never sends a byte (for https: the TLS
    handshake never completes, so the request is never sent).
    """

    def __init__(self, mode: str, gap: float = 0.02):
        self.mode = mode
        self.gap = gap
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.bytes_sent = 0
        self.requests = 0
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if self.mode == "silent":
                self.stop.wait()
                return
            conn.settimeout(2)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.requests += 1
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: 10000000\r\n\r\n"
            )
            while not self.stop.is_set():
                try:
                    conn.sendall(b" ")
                except OSError:
                    return
                self.bytes_sent += 1
                time.sleep(self.gap)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self._accepting.join(timeout=2)
        for thread in self._threads:
            thread.join(timeout=2)


@pytest.fixture
def trickling() -> Iterator[LocalServer]:
    server = LocalServer("trickle")
    yield server
    server.close()


@pytest.fixture
def silent() -> Iterator[LocalServer]:
    server = LocalServer("silent")
    yield server
    server.close()


def real_client(base: str, clock: FakeClock, **policy: Any) -> AttemptRunner[HttpTry]:
    client = AttemptRunner(
        HttpTry(base, clock=clock),
        RemotePolicy(**{"min_try_seconds": 0.0, **policy}),
        clock=clock,
        sleep=clock.asleep,
        rng=MaxRng(),
    )
    _CLIENTS.append(client)
    return client


def test_a_trickling_answer_is_cut_at_the_time_left_as_a_whole(trickling: LocalServer) -> None:
    client = real_client(f"http://127.0.0.1:{trickling.port}", FakeClock())

    attempt = asyncio.run(client.kind.run(make_request(), 0.4))

    # Bytes kept coming every 20 ms, forever, far within any per-read timeout: that the try
    # ended at all is the whole-try bound's doing, and it says so with the time it was
    # given (httpx's own timeouts name themselves: "... (ReadTimeout)").
    assert trickling.bytes_sent >= 5
    assert attempt.error == "process: no answer within 0.4 s"
    assert attempt.applied == "maybe"  # the request was sent: the service may have acted
    assert attempt.retryable


def recorded_bounds(client: AttemptRunner[HttpTry], monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The time each try of ``client`` is given, in the order of the tries."""
    bounds: list[float] = []
    run = client.kind.run

    async def recording(request: AgentRequest, timeout: float, *args: Any) -> Try:
        bounds.append(timeout)
        return await run(request, timeout, *args)

    monkeypatch.setattr(client.kind, "run", recording)
    return bounds


def test_each_try_of_a_trickling_answer_ends_with_the_time_left(
    trickling: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    client = real_client(f"http://127.0.0.1:{trickling.port}", clock)
    bounds = recorded_bounds(client, monkeypatch)
    # 1 s left: the agent stops 0.5 s before it. Try 1 gets 0.5 s, the fake backoff
    # (0.2 s, at its ceiling) leaves try 2 with 0.3 s, and the next wait (0.4 s) runs out.

    outcome = asyncio.run(client.call(make_request(seconds_left=1)))

    assert trickling.requests == 2
    assert outcome.tries == 2
    assert bounds == pytest.approx([0.5, 0.3])
    assert clock.sleeps == [pytest.approx(0.2)]
    assert outcome.error.startswith("process: no answer within 0.3 s")  # cut by its bound
    assert outcome.kind == "deferred"  # a lone order: not counted (test_endpoint_health.py)
    assert outcome.applied == "maybe"


def test_a_connection_that_never_completes_applied_nothing(silent: LocalServer) -> None:
    # https to a server that never speaks: TCP connects, the TLS handshake never ends, and
    # the HTTP request is never sent.
    client = real_client(f"https://127.0.0.1:{silent.port}", FakeClock())

    attempt = asyncio.run(client.kind.run(make_request(), 0.4))

    assert (attempt.applied, attempt.retryable) == ("no", True)
    assert "never sent" in attempt.error


def test_a_request_sent_to_a_server_that_never_answers_may_have_applied(
    silent: LocalServer,
) -> None:
    client = real_client(f"http://127.0.0.1:{silent.port}", FakeClock())

    attempt = asyncio.run(client.kind.run(make_request(), 0.4))

    assert (attempt.applied, attempt.retryable) == ("maybe", True)
    assert attempt.error.startswith("process: no answer within 0.4 s")  # its bound ended it


@pytest.mark.parametrize(("sends", "applied"), [(False, "no"), (True, "maybe")])
def test_no_answer_is_applied_no_only_if_the_request_never_left(sends: bool, applied: str) -> None:
    # An async handler that never answers and raises nothing: only the whole-try bound
    # ends it. Whether the request counts as sent is what the transport's trace says
    # (httpcore reports "http11.send_request_headers.started" when it starts sending).
    async def hang(request: httpx.Request) -> httpx.Response:
        if sends:
            trace = request.extensions["trace"]
            await trace("http11.send_request_headers.started", {"request": request})
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    client, _ = make_client(remote(FakeClock(), ok()), transport=httpx.MockTransport(hang))

    attempt = asyncio.run(client.kind.run(make_request(), 0.3))

    assert (attempt.applied, attempt.retryable) == (applied, True)
    assert attempt.error.startswith("process: no answer within 0.3 s")  # not the hour's sleep
    assert ("never sent" in attempt.error) is not sends


# --- Retry-After ------------------------------------------------------------------------------


def test_retry_after_seconds_is_the_next_wait() -> None:
    r = remote(FakeClock(), status(429, **{"Retry-After": "7"}), ok())
    client, clock = make_client(r)

    assert asyncio.run(client.call(make_request())).kind == "succeeded"

    assert clock.sleeps == [7.0]
    assert r.seen[1].at == T0 + timedelta(seconds=7)


def test_retry_after_http_date_is_the_next_wait() -> None:
    start = datetime.now(UTC)
    retry_at = format_datetime(start + timedelta(seconds=10), usegmt=True)
    r = remote(FakeClock(start), status(503, **{"Retry-After": retry_at}), ok())
    client, clock = make_client(r)

    asyncio.run(client.call(make_request(complete_by=start + timedelta(seconds=30))))

    assert len(clock.sleeps) == 1
    assert 8.5 < clock.sleeps[0] <= 10.0  # the date has whole seconds


def test_retry_after_http_date_is_measured_with_the_clients_clock() -> None:
    retry_at = format_datetime(T0 + timedelta(seconds=7), usegmt=True)
    r = remote(FakeClock(), status(503, **{"Retry-After": retry_at}), ok())
    client, clock = make_client(r)

    assert asyncio.run(client.call(make_request())).kind == "succeeded"
    assert clock.sleeps == [7.0]


@pytest.mark.parametrize("value", ["nan", "inf", "soon", "", "Wed, 32 Foo 2030 25:00:00 GMT"])
def test_an_unparsable_retry_after_is_ignored(value: str) -> None:
    r = remote(FakeClock(), status(503, **{"Retry-After": value}), ok())
    client, clock = make_client(r, backoff_initial_seconds=0.2)

    assert asyncio.run(client.call(make_request())).kind == "succeeded"
    assert len(clock.sleeps) == 1
    assert clock.sleeps[0] <= 0.2  # the usual backoff


@pytest.mark.parametrize(
    "value", ["-5", "0", format_datetime(T0 - timedelta(hours=1), usegmt=True)]
)
def test_a_retry_after_in_the_past_never_makes_tries_faster_than_the_backoff(value: str) -> None:
    r = remote(FakeClock(), status(503, **{"Retry-After": value}), ok())
    client, clock = make_client(r, rng=MaxRng(), backoff_initial_seconds=0.2)

    assert asyncio.run(client.call(make_request())).kind == "succeeded"
    assert clock.sleeps == [0.2]  # the agent's own backoff, not "now"


@pytest.mark.parametrize("code", [503, 429, 500])
def test_retry_after_beyond_the_stop_time_defers_without_calling_again(code: int) -> None:
    r = remote(FakeClock(), status(code, **{"Retry-After": "120"}), ok())
    client, clock = make_client(r)

    outcome = asyncio.run(client.call(make_request(seconds_left=30)))

    assert outcome.kind == "deferred"
    assert outcome.not_before == T0 + timedelta(seconds=120)
    assert outcome.applied == ("maybe" if code == 500 else "no")
    assert "Retry-After" in outcome.error
    assert len(r.seen) == 1
    assert clock.sleeps == []


def test_retry_after_on_a_later_try_counts_from_that_try() -> None:
    r = remote(FakeClock(), status(503), status(503, **{"Retry-After": "60"}), ok())
    client, _ = make_client(r, rng=MaxRng())

    outcome = asyncio.run(client.call(make_request(seconds_left=30)))

    assert outcome.kind == "deferred"
    assert outcome.not_before == r.seen[1].at + timedelta(seconds=60)
    assert r.seen[1].at == T0 + timedelta(seconds=0.2)
    assert len(r.seen) == 2


def test_a_retry_after_just_past_the_stop_time_defers_too() -> None:
    # 30 s left: the agent stops at 25 s; a wait to 25 s exactly does not fit.
    r = remote(FakeClock(), status(503, **{"Retry-After": "25"}), ok())
    client, _ = make_client(r)

    outcome = asyncio.run(client.call(make_request(seconds_left=30)))

    assert (outcome.kind, outcome.not_before, len(r.seen)) == (
        "deferred",
        T0 + timedelta(seconds=25),
        1,
    )


@pytest.mark.parametrize("value", ["99999999999999", "1e300", "Fri, 31 Dec 9999 23:59:59 GMT"])
def test_an_absurd_retry_after_does_not_break_the_client(value: str) -> None:
    r = remote(FakeClock(), status(503, **{"Retry-After": value}))
    client, _ = make_client(r)

    outcome = asyncio.run(client.call(make_request(seconds_left=30)))

    assert outcome.kind == "deferred"
    assert outcome.not_before is not None
    assert outcome.not_before > T0 + timedelta(minutes=10)
    assert len(r.seen) == 1


def test_no_wait_ends_after_the_stop_time() -> None:
    r = remote(FakeClock(), status(503, **{"Retry-After": "2"}))
    client, clock = make_client(r)
    request = make_request(seconds_left=5)  # stops at 4 s

    outcome = asyncio.run(client.call(request))

    assert outcome.kind == "deferred"
    assert clock.now <= request.complete_by - timedelta(seconds=1)
    assert [s.at for s in r.seen] == [T0, T0 + timedelta(seconds=2)]


# --- backoff ------------------------------------------------------------------------------


def test_backoff_waits_grow_are_capped_and_jittered() -> None:
    r = remote(FakeClock(), status(503))
    client, clock = make_client(
        r, rng=random.Random(7), backoff_initial_seconds=0.2, backoff_max_seconds=2.0
    )
    runs: list[list[float]] = []
    for _ in range(100):
        r.script = [*[status(503)] * 6, ok()]
        clock.sleeps.clear()
        outcome = asyncio.run(
            client.call(make_request(complete_by=clock.now + timedelta(seconds=60)))
        )
        assert outcome.kind == "succeeded"
        runs.append(list(clock.sleeps))

    by_try = list(zip(*runs, strict=True))
    ceilings = [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]  # 0.2 * 2^k, capped at backoff_max_seconds
    assert len(by_try) == 6
    for waits, ceiling in zip(by_try, ceilings, strict=True):
        assert all(0 <= w <= ceiling for w in waits)
        assert max(waits) > ceiling / 2  # the window really widens to the ceiling
        assert len(set(waits)) > 90  # jittered, not a fixed schedule
    means = [sum(w) / len(w) for w in by_try]
    assert means[0] < means[2] < means[4]


def test_backoff_is_equal_jitter_drawn_from_the_injected_rng() -> None:
    rng = MaxRng()
    r = remote(FakeClock(), *([status(503)] * 7), ok())
    client, clock = make_client(r, rng=rng, backoff_initial_seconds=0.25, backoff_max_seconds=3)

    assert asyncio.run(client.call(make_request(seconds_left=60))).kind == "succeeded"

    # never less than half the ceiling: a try cannot follow the last one at once
    assert rng.bounds == [
        (0.125, 0.25),
        (0.25, 0.5),
        (0.5, 1.0),
        (1.0, 2.0),
        (1.5, 3),
        (1.5, 3),
        (1.5, 3),
    ]
    assert clock.sleeps == [0.25, 0.5, 1.0, 2.0, 3, 3, 3]


# --- the stop time -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "margin"), [(100, 5.0), (25, 5.0), (10, 2.0), (1, 0.5), (-3, 0.5)]
)
def test_the_reply_margin_is_a_fifth_of_the_time_left_clamped(left: float, margin: float) -> None:
    assert RemotePolicy().reply_margin(left) == pytest.approx(margin)


def test_no_try_starts_after_the_stop_time() -> None:
    r = remote(FakeClock(), status(503))
    client, _ = make_client(r, backoff_initial_seconds=0.5)
    request = make_request(seconds_left=5)  # stops at 4 s

    outcome = asyncio.run(client.call(request))

    assert outcome.kind == "deferred"
    assert outcome.tries == len(r.seen) >= 3
    assert all(s.at < T0 + timedelta(seconds=4) for s in r.seen)


@pytest.mark.parametrize("seconds_left", [-3600, -5, 0, 0.5, 0.2])
def test_no_call_at_all_when_no_time_is_left(seconds_left: float) -> None:
    r = remote(FakeClock(), ok())
    client, clock = make_client(r)

    outcome = asyncio.run(client.call(make_request(seconds_left=seconds_left)))

    assert outcome.kind == "deferred"
    assert (outcome.tries, outcome.applied, outcome.not_before) == (0, "no", clock.now)
    assert "no time left" in outcome.error
    assert r.seen == []


@pytest.mark.parametrize(
    ("seconds_left", "read", "connect"),
    [(30, 10.0, 3.0), (4, 3.2, 3.0), (2, 1.5, 1.5)],
)
def test_the_try_timeout_is_bounded_by_the_time_left(
    seconds_left: float, read: float, connect: float
) -> None:
    r = remote(FakeClock(), ok())
    client, _ = make_client(r, max_try_seconds=10, connect_seconds=3)

    asyncio.run(client.call(make_request(seconds_left=seconds_left)))

    assert r.seen[0].timeout == pytest.approx(
        {"connect": connect, "read": read, "write": read, "pool": read}
    )


def test_every_try_timeout_fits_in_the_time_left_at_that_try() -> None:
    r = remote(FakeClock(), httpx.ReadTimeout)
    client, _ = make_client(r)
    request = make_request(seconds_left=8)
    stop = request.complete_by - timedelta(seconds=1.6)

    assert asyncio.run(client.call(request)).kind == "deferred"

    assert len(r.seen) >= 3
    for seen in r.seen:
        left = (stop - seen.at).total_seconds()
        assert 0 < max(seen.timeout.values()) <= left + 1e-6


# --- the agent ----------------------------------------------------------------------------


class RecordingTransport:
    """The reply queue: ``failures`` sends raise StorageUnavailable first."""

    def __init__(self, failures: int = 0):
        self.failures = failures
        self.sends = 0
        self.replies: list[tuple[AgentReply, str | None]] = []

    def send_request(self, request: AgentRequest) -> bool:
        raise AssertionError("an agent sends no requests")

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        self.sends += 1
        if self.sends <= self.failures:
            raise StorageUnavailable("queue busy")
        self.replies.append((reply, reply_to))
        return True


class StubRemote:
    """A remote client that returns a given outcome (after ``takes`` fake seconds)."""

    def __init__(self, clock: FakeClock, outcome: CallOutcome, takes: float = 0):
        self.clock = clock
        self.outcome = outcome
        self.takes = takes
        self.requests: list[AgentRequest] = []

    async def call(self, request: AgentRequest) -> CallOutcome:
        self.requests.append(request)
        self.clock.advance(self.takes)
        return self.outcome


class Binds:
    """A binding from a function, never at hand (it always runs on the agent's threads)."""

    def __init__(self, bind: Callable[[AgentRequest, str | None], AgentRequest]) -> None:
        self._bind = bind

    def __call__(self, request: AgentRequest, copy: str | None = None) -> AgentRequest:
        return self._bind(request, copy)

    def at_hand(self, request: AgentRequest, copy: str | None = None) -> AgentRequest | None:
        return None


def make_agent(
    *script: Step, failures: int = 0, bind: Any = None, **kw: Any
) -> tuple[AgentWorker, Remote, RecordingTransport]:
    r = remote(FakeClock(), *script)
    client, clock = make_client(r)
    transport = RecordingTransport(failures)
    binding = Binds(bind) if bind is not None else None
    agent = AgentWorker(client, transport, clock, sleep=clock.sleep, bind=binding, **kw)
    return agent, r, transport


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (
            CallOutcome(Outcome.SUCCEEDED, result={"reservation": "r-1"}, tries=2),
            {"outcome": "succeeded", "result": {"reservation": "r-1"}},
        ),
        (
            CallOutcome(Outcome.REFUSED, error="process: HTTP 409 out of stock", tries=1),
            {"outcome": "failed", "error": "process: HTTP 409 out of stock", "applied": "no"},
        ),
        (
            CallOutcome(
                Outcome.TRANSIENT, error="process: HTTP 500", applied=Applied.MAYBE, tries=4
            ),
            {"outcome": "transient", "error": "process: HTTP 500", "applied": "maybe"},
        ),
        (
            CallOutcome(Outcome.TRANSIENT, error="process: HTTP 503", applied=Applied.NO, tries=4),
            {"outcome": "transient", "error": "process: HTTP 503", "applied": "no"},
        ),
        (
            CallOutcome(
                Outcome.DEFERRED,
                error="circuit open",
                applied=Applied.NO,
                not_before=T0 + timedelta(seconds=7),
            ),
            {
                "outcome": "deferred",
                "error": "circuit open",
                "applied": "no",
                "notBefore": iso(T0 + timedelta(seconds=7)),
            },
        ),
        (
            CallOutcome(
                Outcome.DEFERRED,
                error="down for everyone",
                applied=Applied.MAYBE,
                not_before=T0 + timedelta(seconds=90),
            ),
            {
                "outcome": "deferred",
                "error": "down for everyone",
                "applied": "maybe",
                "notBefore": iso(T0 + timedelta(seconds=90)),
            },
        ),
    ],
)
def test_the_agent_sends_exactly_one_reply_per_outcome(
    outcome: CallOutcome, expected: dict[str, Any]
) -> None:
    clock = FakeClock()
    transport = RecordingTransport()
    agent = AgentWorker(StubRemote(clock, outcome), transport, clock, sleep=clock.sleep)  # type: ignore[arg-type]
    request = make_request(attempt=3)

    handled = asyncio.run(agent.handle(request, reply_to="agent-replies-x"))
    assert handled.wire == expected["outcome"]  # the wire's word: a refusal is "failed"

    ((reply, reply_to),) = transport.replies
    assert reply_to == "agent-replies-x"
    sent = json.loads(reply.encode())
    head = {
        "orderId": "o-1",
        "step": "process",
        "attempt": 3,
        "idempotencyKey": KEY,
        "completeBy": iso(request.complete_by),
    }
    if expected["outcome"] == "succeeded":  # when the agent got the answer, by its clock
        expected = {**expected, "answeredAt": iso(clock())}
    assert sent == {**head, **expected}
    assert decode_reply(reply.encode()) == reply


def test_the_agent_end_to_end_success() -> None:
    agent, r, transport = make_agent(status(503), ok({"reservation": "r-1"}))
    request = make_request()

    assert asyncio.run(agent.handle(request, reply_to="agent-replies-x")) is Outcome.SUCCEEDED

    [(sent, to)] = transport.replies
    assert (unanswered(sent), to) == (request.succeeded({"reservation": "r-1"}), "agent-replies-x")
    assert len(r.seen) == 2


def test_the_agent_end_to_end_refusal_with_a_bounded_error() -> None:
    agent, r, transport = make_agent(status(422, error="x" * 5000))

    assert asyncio.run(agent.handle(make_request())) is Outcome.REFUSED

    ((reply, _),) = transport.replies
    assert (reply.outcome.wire, reply.applied) == ("failed", "no")
    assert reply.error is not None
    assert len(reply.error) <= 1000  # the detail is cut at 300 characters, the error at 1000
    assert reply.error.startswith("process: HTTP 422 xxx")
    assert len(r.seen) == 1


def test_the_agent_reports_a_success_that_arrives_after_the_deadline() -> None:
    clock = FakeClock()

    def slow(request: httpx.Request) -> httpx.Response:
        clock.advance(31)  # the answer comes after CompleteBy
        return ok({"late": True})

    r = remote(clock, slow)
    client, _ = make_client(r)
    transport = RecordingTransport()
    request = make_request(30)

    assert asyncio.run(AgentWorker(client, transport, clock).handle(request)) is Outcome.SUCCEEDED

    assert clock.now > request.complete_by
    [(sent, _)] = transport.replies
    assert unanswered(sent) == request.succeeded({"late": True})
    assert sent.answered_at == clock.now > request.complete_by  # its own time, after it


@pytest.mark.parametrize("kind", ["refused", "transient", "deferred"])
def test_the_agent_reports_any_outcome_that_comes_after_the_deadline(kind: str) -> None:
    clock = FakeClock()
    outcome = CallOutcome(Outcome(kind), error="e", applied=Applied.NO, not_before=T0)
    transport = RecordingTransport()
    agent = AgentWorker(StubRemote(clock, outcome, takes=45), transport, clock)  # type: ignore[arg-type]

    request = make_request(30)
    assert clock() < request.complete_by
    asyncio.run(agent.handle(request))

    # Reported after the deadline, in full: the outcome on the wire, its error, its
    # applied, and for a deferral its notBefore (a late report corrects the expiry).
    assert clock() > request.complete_by  # the call took 45 s of a 30 s budget
    ((reply, _),) = transport.replies
    wire = {"refused": "failed", "transient": "transient", "deferred": "deferred"}[kind]
    assert (reply.outcome.wire, reply.error, reply.applied) == (wire, "e", "no")
    assert reply.not_before == (T0 if kind == "deferred" else None)
    assert decode_reply(reply.encode()) == reply


@pytest.mark.parametrize("seconds_left", [0, -1, -3600])
def test_a_request_past_its_deadline_is_not_called_and_replied_deferred(
    seconds_left: float,
) -> None:
    agent, r, transport = make_agent(ok())

    assert asyncio.run(agent.handle(make_request(seconds_left=seconds_left))) is Outcome.DEFERRED

    assert r.seen == []
    ((reply, _),) = transport.replies
    assert (reply.outcome, reply.applied, reply.not_before) == ("deferred", "no", T0)


def test_the_agent_calls_with_what_the_binding_reads_from_the_state() -> None:
    """Path, key and body come from the claim the request is bound to (agents/binding.py),
    never from the message: a body too large to travel, or one that was tampered with."""
    bound: list[str] = []
    big = {"orderId": "o-1", "lines": ["x" * 100] * 500}

    def bind(request: AgentRequest, copy: str | None = None) -> AgentRequest:
        bound.append(request.order_id)
        return replace(request, order=big, path="process", key_round=2)

    agent, r, transport = make_agent(ok(), bind=bind)

    tampered = replace(make_request(order={"orderId": "o-1", "forged": True}), path="ship")
    assert asyncio.run(agent.handle(tampered)) is Outcome.SUCCEEDED
    assert asyncio.run(agent.handle(make_request(order=None))) is Outcome.SUCCEEDED

    assert bound == ["o-1", "o-1"]
    assert [s.body for s in r.seen] == [big, big]
    assert [s.url.rsplit("/", 1)[1] for s in r.seen] == ["process", "process"]
    assert {s.idempotency_key for s in r.seen} == {"o-1:process:2"}
    assert len(transport.replies) == 2


class CountingThreads(OwnThreads):
    def __init__(self) -> None:
        super().__init__("counted")
        self.ran: list[str] = []

    async def run[T](self, work: Callable[[], T], *, bound: float, what: str) -> T:
        self.ran.append(what)
        return await super().run(work, bound=bound, what=what)


def test_a_binding_at_hand_takes_no_thread_and_one_that_is_not_runs_on_the_agents() -> None:
    """What the binding can decide with no request (``at_hand``) is decided on the event
    loop; otherwise the binding runs on the agent's own threads. Both call the same."""

    class Binding:
        def __init__(self, at_hand: bool) -> None:
            self.hand, self.called = at_hand, 0

        def __call__(self, request: AgentRequest, copy: str | None = None) -> AgentRequest:
            self.called += 1
            return replace(request, path="process")

        def at_hand(self, request: AgentRequest, copy: str | None = None) -> AgentRequest | None:
            return replace(request, path="process") if self.hand else None

    for hand in (True, False):
        threads, binding = CountingThreads(), Binding(hand)
        r = remote(FakeClock(), ok())
        client, clock = make_client(r)
        transport = RecordingTransport(0)
        agent = AgentWorker(
            client, transport, clock, bind=binding, sleep=clock.sleep, threads=threads
        )
        assert asyncio.run(agent.handle(make_request())) is Outcome.SUCCEEDED
        binds = ["the request's binding"] if not hand else []
        assert threads.ran == [*binds, "the reply's hand-over"]
        assert binding.called == (0 if hand else 1)
        assert [s.url.rsplit("/", 1)[1] for s in r.seen] == ["process"]


def test_a_copy_whose_attempt_another_copy_took_calls_nothing_and_replies_nothing() -> None:
    """Storage queues: the binding is given each copy's message id, and refuses a copy
    whose attempt another copy took (``RequestBinding``): nothing is called or sent."""
    taken: dict[tuple[str, int], str] = {}

    def bind(request: AgentRequest, copy: str | None = None) -> AgentRequest:
        assert copy is not None
        if taken.setdefault((request.order_id, request.attempt), copy) != copy:
            raise DuplicateRequest("taken by another copy", order_id=request.order_id)
        return request

    agent, r, transport = make_agent(ok(), ok(), bind=bind)

    assert asyncio.run(agent.handle(make_request(), copy="m-1")) is Outcome.SUCCEEDED
    with pytest.raises(DuplicateRequest):
        asyncio.run(agent.handle(make_request(), copy="m-2"))
    again = agent.handle(make_request(), deliveries=2, copy="m-1")
    assert asyncio.run(again) is Outcome.SUCCEEDED
    assert len(r.seen) == 2 and len(transport.replies) == 2  # m-2 called and sent nothing


def test_a_request_its_binding_refuses_calls_nothing_and_replies_nothing() -> None:
    def bind(request: AgentRequest, copy: str | None = None) -> AgentRequest:
        raise UnboundMessage("no claim speaks for it", order_id=request.order_id)

    agent, r, transport = make_agent(ok(), bind=bind)

    with pytest.raises(UnboundMessage):
        asyncio.run(agent.handle(make_request()))
    assert r.seen == [] and transport.replies == []


def test_an_agent_that_cannot_load_orders_calls_nothing_and_fails_the_invocation() -> None:
    agent, r, transport = make_agent(ok())

    with pytest.raises(StorageUnavailable, match="no order body"):
        asyncio.run(agent.handle(make_request(order=None)))

    assert r.seen == []
    assert transport.replies == []


def test_the_reply_send_is_retried_on_storage_trouble() -> None:
    agent, r, transport = make_agent(ok(), failures=3)
    request = make_request()

    assert asyncio.run(agent.handle(request)) is Outcome.SUCCEEDED

    assert transport.sends == 4
    [(sent, to)] = transport.replies
    assert (unanswered(sent), to) == (request.succeeded({"ok": True}), None)
    assert len(r.seen) == 1  # the remote is not called again
    assert len(r.clock.sleeps) == 3  # through the injected sleep


@pytest.mark.timeout(20)
def test_the_reply_send_gives_up_after_its_budget() -> None:
    agent, r, transport = make_agent(ok(), failures=10**9)

    with pytest.raises(StorageUnavailable):
        asyncio.run(agent.handle(make_request()))

    # The budget is measured in the time the injected sleep spends, not in real time
    # (a budget in real time would outlast the test's timeout): every wait between two
    # sends went through it, and together they spent the budget.
    assert len(r.clock.sleeps) == transport.sends - 1
    slept = sum(r.clock.sleeps)
    assert REPLY_SEND_SECONDS - 5 <= slept <= REPLY_SEND_SECONDS + 5
    assert 5 < transport.sends < 100
    assert len(r.seen) == 1


def test_a_large_result_is_cut_and_the_reply_still_fits_its_queue() -> None:
    big = {"items": [{"sku": f"s-{i}", "text": "ü€😀" * 40} for i in range(2000)]}
    agent, _, transport = make_agent(ok(big))

    assert asyncio.run(agent.handle(make_request())) is Outcome.SUCCEEDED

    ((reply, _),) = transport.replies
    assert reply.result is not None
    assert reply.result["truncated"] is True
    assert reply.result["size"] > MAX_RESULT_CHARS
    assert len(reply.encode().encode("utf-8")) < QUEUE_MESSAGE_BYTES


def test_the_largest_uncut_result_still_fits_its_queue() -> None:
    # Just under the cut, in characters outside the BMP (12 ASCII bytes each as escapes):
    # the worst case for the reply's size.
    worst = {"t": "😀" * ((MAX_RESULT_CHARS - 20) // 12)}
    assert len(json.dumps(worst, separators=(",", ":"))) <= MAX_RESULT_CHARS
    trace = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=" + "x" * 500,
    }
    agent, _, transport = make_agent(ok(worst))

    asyncio.run(agent.handle(make_request(order_id="o-" + "9" * 62, trace=trace)))

    ((reply, _),) = transport.replies
    assert reply.result == worst
    assert len(reply.encode().encode("utf-8")) < QUEUE_MESSAGE_BYTES


def test_no_try_starts_too_short_to_be_answered() -> None:
    """A try cut after a few milliseconds would turn a call into "may have applied":
    with less than ``min_try_seconds`` left, the agent does not start one."""
    r = remote(FakeClock(), status(503))
    client, _ = make_client(r, min_try_seconds=1.0, rng=MaxRng())
    # 3 s left, 0.6 s margin: try 1; wait 0.2 s; try 2 needs 1 s: 2.4 - 0.2 >= 1, go;
    # each 503 answers at once on the fake clock, so tries go on until < 1 s would be left.
    outcome = asyncio.run(client.call(make_request(seconds_left=3)))
    assert outcome.applied == "no"
    stop_at = T0 + timedelta(seconds=3 - 0.6)
    assert len(r.seen) >= 2
    assert all(stop_at - seen.at >= timedelta(seconds=1) for seen in r.seen)
    late = make_request(seconds_left=1.2)  # margin 0.5 s: only 0.7 s to try in
    before = len(r.seen)
    outcome = asyncio.run(client.call(late))
    assert len(r.seen) == before  # not called
    assert outcome.kind == "deferred" and outcome.applied == "no"


def test_a_2xx_whose_body_cannot_be_parsed_is_still_a_success() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000  # RecursionError in json
    r = remote(FakeClock(), httpx.Response(200, content=deep))
    client, _ = make_client(r)
    outcome = asyncio.run(client.call(make_request()))
    assert outcome.kind == "succeeded" and outcome.result is not None
    assert outcome.result["status"] == 200


def test_a_refusal_after_a_try_that_may_have_applied_says_maybe() -> None:
    r = remote(FakeClock(), status(500), status(422, error="invalid"))
    client, _ = make_client(r)
    outcome = asyncio.run(client.call(make_request()))
    assert (outcome.kind, outcome.applied, outcome.settled) == ("refused", "maybe", True)


def test_a_key_in_use_is_retried_and_may_have_applied() -> None:
    """409: an earlier call with the key may still be running: transient, "maybe"."""
    r = remote(FakeClock(), status(409, error="in progress"), ok({"done": 1}))
    client, _ = make_client(r)
    assert asyncio.run(client.call(make_request())).result == {"done": 1}
    assert len(r.seen) == 2
    r = remote(FakeClock(), *[status(409, error="in progress")] * 40)
    client, _ = make_client(r)
    outcome = asyncio.run(client.call(make_request(seconds_left=10)))
    assert outcome.applied == "maybe" and outcome.kind in ("transient", "deferred")


def test_compressed_answers_are_not_asked_for() -> None:
    r = remote(FakeClock(), ok())
    client, _ = make_client(r)
    asyncio.run(client.call(make_request()))
    assert r.seen[0].headers["accept-encoding"] == "identity"

"""The resilient remote client (contract 3.4) and the agent, on httpx.MockTransport and a fake clock.

Nothing here sleeps or opens a socket: the fake ``sleep`` advances the fake clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from agents.agent import Agent, AgentOutcome
from agents.remote import RemotePolicy, RemoteServiceClient
from core.errors import DeadlineExceeded, RemoteCallFailed
from core.messages import AgentReply, AgentRequest

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
BASE = "http://remote.test/api"
ORDER = {"orderId": "o-1", "qty": 2, "note": "Zoë"}
TRANSIENT_STATUSES = [408, 425, 429, 500, 502, 503, 504]
PERMANENT_STATUSES = [400, 401, 403, 404, 409, 422]


class FakeClock:
    """A UTC clock that only moves when ``sleep`` (or a test) moves it."""

    def __init__(self, start: datetime = T0):
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def sleep(self, seconds: float) -> None:
        # As strict as time.sleep, so a bad wait fails here as it would in production.
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"sleep length must be a non-negative number, got {seconds!r}")
        self.sleeps.append(seconds)
        self.advance(seconds)


@dataclass
class Seen:
    method: str
    url: str
    body: Any
    idempotency_key: str | None
    timeout: dict[str, float]
    at: datetime


Step = httpx.Response | type[Exception] | Callable[[httpx.Request], httpx.Response]


class Remote:
    """A scripted remote service: one entry per try, the last one repeats."""

    def __init__(self, clock: FakeClock, *script: Step):
        self.clock = clock
        self.script = list(script)
        self.seen: list[Seen] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(
            Seen(
                request.method,
                str(request.url),
                json.loads(request.content),
                request.headers.get("Idempotency-Key"),
                dict(request.extensions["timeout"]),
                self.clock(),
            )
        )
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, type):
            raise step("simulated", request=request)  # type: ignore[call-arg]
        if callable(step) and not isinstance(step, httpx.Response):
            return step(request)
        return step


def ok(body: Any = None) -> httpx.Response:
    return httpx.Response(200, json={"ok": True} if body is None else body)


def status(code: int, error: str = "busy", **headers: str) -> httpx.Response:
    return httpx.Response(code, json={"error": error}, headers=headers)


def make_request(
    seconds_left: float = 30, *, path: str = "process", step: str = "process", **changes: Any
) -> AgentRequest:
    fields: dict[str, Any] = {
        "order_id": "o-1",
        "step": step,
        "attempt": 1,
        "complete_by": T0 + timedelta(seconds=seconds_left),
        "path": path,
        "order": ORDER,
    }
    fields.update(changes)
    return AgentRequest(**fields)


def make_client(
    remote: Remote, base: str = BASE, **policy: Any
) -> tuple[RemoteServiceClient, FakeClock]:
    client = RemoteServiceClient(
        base,
        RemotePolicy(**policy),
        transport=httpx.MockTransport(remote),
        clock=remote.clock,
        sleep=remote.clock.sleep,
    )
    return client, remote.clock


# --- the request on the wire ------------------------------------------------------------


def test_success_posts_the_order_with_the_idempotency_key_and_returns_the_json() -> None:
    remote = Remote(FakeClock(), ok({"reservation": "r-1", "lines": [1, 2]}))
    client, clock = make_client(remote, base=BASE + "/")

    result = client.call(make_request())

    assert result == {"reservation": "r-1", "lines": [1, 2]}
    assert [(s.method, s.url, s.body, s.idempotency_key) for s in remote.seen] == [
        ("POST", "http://remote.test/api/process", ORDER, "o-1:process")
    ]
    assert clock.sleeps == []


def test_the_path_names_the_remote_service() -> None:
    remote = Remote(FakeClock(), ok())
    client, _ = make_client(remote)

    client.call(make_request(path="stock/reserve", step="reserve-stock"))

    assert remote.seen[0].url == "http://remote.test/api/stock/reserve"
    assert remote.seen[0].idempotency_key == "o-1:reserve-stock"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (httpx.Response(201, json={"id": 7}), {"id": 7}),
        (httpx.Response(200, json=[1, 2]), {"value": [1, 2]}),
        (httpx.Response(204), {"status": 204, "text": ""}),
    ],
)
def test_any_2xx_is_success(response: httpx.Response, expected: dict[str, Any]) -> None:
    client, _ = make_client(Remote(FakeClock(), response))

    assert client.call(make_request()) == expected


def test_the_same_idempotency_key_on_every_try_and_every_attempt() -> None:
    remote = Remote(FakeClock(), status(503), status(502), ok())
    client, _ = make_client(remote)

    client.call(make_request(attempt=1))
    remote.script = [status(500), ok()]
    client.call(make_request(attempt=7))

    assert [s.idempotency_key for s in remote.seen] == ["o-1:process"] * 5
    assert all(s.body == ORDER for s in remote.seen)


# --- transient and permanent failures --------------------------------------------------------


@pytest.mark.parametrize("code", TRANSIENT_STATUSES)
def test_transient_statuses_are_retried(code: int) -> None:
    remote = Remote(FakeClock(), status(code), status(code), ok({"done": 1}))
    client, clock = make_client(remote)

    assert client.call(make_request()) == {"done": 1}
    assert len(remote.seen) == 3
    assert len(clock.sleeps) == 2


@pytest.mark.parametrize(
    "error",
    [httpx.ConnectError, httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ConnectTimeout],
)
def test_connection_errors_and_timeouts_are_retried(error: type[Exception]) -> None:
    remote = Remote(FakeClock(), error, ok({"done": 1}))
    client, clock = make_client(remote)

    assert client.call(make_request()) == {"done": 1}
    assert len(remote.seen) == 2
    assert len(clock.sleeps) == 1


@pytest.mark.parametrize("code", PERMANENT_STATUSES)
def test_other_4xx_are_permanent_and_not_retried(code: int) -> None:
    remote = Remote(FakeClock(), status(code, error="out of stock"), ok())
    client, clock = make_client(remote)

    with pytest.raises(RemoteCallFailed) as info:
        client.call(make_request())

    assert info.value.retryable is False
    assert info.value.status == code
    assert str(info.value) == f"process: HTTP {code} out of stock"
    assert len(remote.seen) == 1
    assert clock.sleeps == []


def test_a_permanent_failure_without_json_carries_the_text() -> None:
    remote = Remote(FakeClock(), httpx.Response(400, text="sku missing"))
    client, _ = make_client(remote)

    with pytest.raises(RemoteCallFailed, match=r"^process: HTTP 400 sku missing$"):
        client.call(make_request())


# --- waits ------------------------------------------------------------------------------


def test_retry_after_seconds_is_the_next_wait() -> None:
    remote = Remote(FakeClock(), status(429, **{"Retry-After": "7"}), ok())
    client, clock = make_client(remote)

    client.call(make_request())

    assert clock.sleeps == [7.0]
    assert remote.seen[1].at == T0 + timedelta(seconds=7)


def test_retry_after_http_date_is_the_next_wait() -> None:
    # _retry_after reads the wall clock for dates, so this test's clock is the wall clock.
    start = datetime.now(UTC)
    retry_at = format_datetime(start + timedelta(seconds=10), usegmt=True)
    remote = Remote(FakeClock(start), status(503, **{"Retry-After": retry_at}), ok())
    client, clock = make_client(remote)

    client.call(make_request(seconds_left=30, complete_by=start + timedelta(seconds=30)))

    assert len(clock.sleeps) == 1
    assert 8.5 < clock.sleeps[0] <= 10.0  # the date has whole seconds


def test_retry_after_http_date_is_measured_with_the_clients_clock() -> None:
    retry_at = format_datetime(T0 + timedelta(seconds=7), usegmt=True)
    remote = Remote(FakeClock(), status(503, **{"Retry-After": retry_at}), ok())
    client, clock = make_client(remote)

    assert client.call(make_request()) == {"ok": True}
    assert clock.sleeps == [7.0]


@pytest.mark.parametrize("value", ["nan", "soon", "Wed, 32 Foo 2030 25:00:00 GMT"])
def test_an_unparsable_retry_after_is_ignored(value: str) -> None:
    remote = Remote(FakeClock(), status(503, **{"Retry-After": value}), ok())
    client, _ = make_client(remote)

    assert client.call(make_request()) == {"ok": True}


def test_retry_after_beyond_the_deadline_gives_up_without_waiting() -> None:
    remote = Remote(FakeClock(), status(503, **{"Retry-After": "120"}), ok())
    client, clock = make_client(remote)

    with pytest.raises(DeadlineExceeded) as info:
        client.call(make_request(seconds_left=30))

    assert clock.sleeps == []
    assert len(remote.seen) == 1
    assert isinstance(info.value.__cause__, RemoteCallFailed)
    assert info.value.__cause__.status == 503


def test_backoff_waits_grow_are_capped_and_jittered() -> None:
    remote = Remote(FakeClock(), status(503))
    client, clock = make_client(
        remote, backoff_initial_seconds=0.2, backoff_max_seconds=2.0, breaker_fail_max=10_000
    )
    runs: list[list[float]] = []
    for _ in range(100):
        remote.script = [status(503)] * 6 + [ok()]
        clock.sleeps.clear()
        client.call(make_request(complete_by=clock.now + timedelta(seconds=60)))
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


# --- the deadline -------------------------------------------------------------------------


def test_no_try_starts_after_the_deadline_less_the_reply_margin() -> None:
    remote = Remote(FakeClock(), status(503))
    client, _ = make_client(
        remote, reply_margin_seconds=0.5, backoff_initial_seconds=0.5, breaker_fail_max=10_000
    )
    request = make_request(seconds_left=5)

    with pytest.raises(DeadlineExceeded):
        client.call(request)

    last_start = request.complete_by - timedelta(seconds=0.5)
    assert len(remote.seen) >= 3
    assert all(s.at < last_start for s in remote.seen)


@pytest.mark.parametrize("code", [503, 429])
def test_time_running_out_on_transient_failures_raises_deadline_exceeded(code: int) -> None:
    remote = Remote(FakeClock(), status(code))
    client, _ = make_client(remote)

    with pytest.raises(DeadlineExceeded) as info:
        client.call(make_request(seconds_left=3))

    assert not isinstance(info.value, RemoteCallFailed)
    assert (info.value.order_id, info.value.step) == ("o-1", "process")


def test_connection_errors_until_the_deadline_raise_deadline_exceeded() -> None:
    remote = Remote(FakeClock(), httpx.ConnectError)
    client, _ = make_client(remote, breaker_fail_max=10_000)

    with pytest.raises(DeadlineExceeded):
        client.call(make_request(seconds_left=3))


@pytest.mark.parametrize("seconds_left", [-5, 0, 0.5, 0.2])
def test_no_call_at_all_when_no_time_is_left(seconds_left: float) -> None:
    remote = Remote(FakeClock(), ok())
    client, _ = make_client(remote, reply_margin_seconds=0.5)

    with pytest.raises(DeadlineExceeded, match="no time left before the deadline"):
        client.call(make_request(seconds_left=seconds_left))

    assert remote.seen == []


@pytest.mark.parametrize(
    ("seconds_left", "read", "connect"),
    [(30, 10.0, 3.0), (4, 3.5, 3.0), (2, 1.5, 1.5)],
)
def test_the_try_timeout_is_bounded_by_the_time_left(
    seconds_left: float, read: float, connect: float
) -> None:
    remote = Remote(FakeClock(), ok())
    client, _ = make_client(remote, max_try_seconds=10, connect_seconds=3, reply_margin_seconds=0.5)

    client.call(make_request(seconds_left=seconds_left))

    assert remote.seen[0].timeout == {
        "connect": connect,
        "read": read,
        "write": read,
        "pool": read,
    }


def test_every_retry_timeout_fits_in_the_time_left_at_that_try() -> None:
    remote = Remote(FakeClock(), httpx.ReadTimeout)
    client, _ = make_client(remote, reply_margin_seconds=0.5, breaker_fail_max=10_000)
    request = make_request(seconds_left=8)

    with pytest.raises(DeadlineExceeded):
        client.call(request)

    deadline = request.complete_by - timedelta(seconds=0.5)
    assert len(remote.seen) >= 3
    for seen in remote.seen:
        left = (deadline - seen.at).total_seconds()
        assert 0 < max(seen.timeout.values()) <= left + 1e-6


def test_no_wait_ends_after_the_deadline() -> None:
    remote = Remote(FakeClock(), status(503, **{"Retry-After": "2"}))
    client, clock = make_client(remote, reply_margin_seconds=0.5, breaker_fail_max=10_000)
    request = make_request(seconds_left=3)

    with pytest.raises(DeadlineExceeded):
        client.call(request)

    assert clock.now <= request.complete_by - timedelta(seconds=0.5)


# --- circuit breaker ------------------------------------------------------------------------


def test_breaker_opens_after_fail_max_transient_failures_and_spares_the_endpoint() -> None:
    remote = Remote(FakeClock(), status(503))
    client, clock = make_client(remote, breaker_fail_max=3)

    with pytest.raises(DeadlineExceeded):
        client.call(make_request(seconds_left=30))
    assert len(remote.seen) == 3
    assert client.breaker("process").state == "open"

    remote.script = [ok()]
    with pytest.raises(DeadlineExceeded):
        client.call(make_request(complete_by=clock.now + timedelta(seconds=10)))
    assert len(remote.seen) == 3  # nothing reached the transport while open

    client.breaker("process").reset()  # what the recovery timeout leads to
    assert client.call(make_request(complete_by=clock.now + timedelta(seconds=10))) == {"ok": True}
    assert len(remote.seen) == 4


def test_breaker_does_not_open_on_permanent_failures() -> None:
    remote = Remote(FakeClock(), status(404, error="no such order"))
    client, _ = make_client(remote, breaker_fail_max=3)

    for _ in range(6):
        with pytest.raises(RemoteCallFailed) as info:
            client.call(make_request())
        assert info.value.retryable is False

    assert len(remote.seen) == 6
    assert client.breaker("process").state == "closed"


def test_breakers_are_per_path() -> None:
    remote = Remote(FakeClock(), status(503))
    client, clock = make_client(remote, breaker_fail_max=2)
    with pytest.raises(DeadlineExceeded):
        client.call(make_request(seconds_left=5))
    assert client.breaker("process").state == "open"

    remote.script = [ok({"shipped": True})]
    request = make_request(path="ship", step="ship", complete_by=clock.now + timedelta(seconds=10))

    assert client.call(request) == {"shipped": True}
    assert remote.seen[-1].url == "http://remote.test/api/ship"
    assert client.breaker("ship").state == "closed"


def test_an_unsendable_body_is_a_permanent_failure() -> None:
    remote = Remote(FakeClock(), ok())
    client, _ = make_client(remote, breaker_fail_max=3)
    poisoned = make_request(order={"orderId": "o-1", "price": float("nan")})

    for _ in range(3):
        with pytest.raises(RemoteCallFailed) as info:
            client.call(poisoned)
        assert info.value.retryable is False

    assert client.call(make_request()) == {"ok": True}


def test_trace_context_cannot_replace_the_idempotency_key() -> None:
    remote = Remote(FakeClock(), ok())
    client, _ = make_client(remote)

    client.call(make_request(trace={"traceparent": "00-abc-def-01", "Idempotency-Key": "x"}))

    assert remote.seen[0].idempotency_key == "o-1:process"


# --- the agent ----------------------------------------------------------------------------


class RecordingTransport:
    def __init__(self, accept: bool = True):
        self.accept = accept
        self.replies: list[tuple[AgentReply, str | None]] = []
        self.requests: list[AgentRequest] = []

    def send_request(self, request: AgentRequest) -> bool:
        self.requests.append(request)
        return self.accept

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        self.replies.append((reply, reply_to))
        return self.accept


def make_agent(*script: Step, accept: bool = True) -> tuple[Agent, Remote, RecordingTransport]:
    remote = Remote(FakeClock(), *script)
    client, clock = make_client(remote)
    transport = RecordingTransport(accept)
    return Agent(client, transport, clock), remote, transport


def test_agent_success_sends_one_succeeded_reply() -> None:
    agent, _, transport = make_agent(status(503), ok({"reservation": "r-1"}))
    request = make_request()

    assert agent.handle(request, reply_to="agent-replies-x") is AgentOutcome.SUCCEEDED
    assert transport.replies == [(request.succeeded({"reservation": "r-1"}), "agent-replies-x")]


def test_agent_permanent_failure_sends_one_failed_reply_with_the_error() -> None:
    agent, remote, transport = make_agent(status(409, error="out of stock"))
    request = make_request()

    assert agent.handle(request) is AgentOutcome.FAILED
    assert transport.replies == [(request.failed("process: HTTP 409 out of stock"), None)]
    assert len(remote.seen) == 1


def test_agent_failed_reply_error_is_bounded() -> None:
    agent, _, transport = make_agent(status(422, error="x" * 5000))

    agent.handle(make_request())

    ((reply, _),) = transport.replies
    assert reply.error is not None
    assert len(reply.error) == 1000
    assert reply.error.startswith("process: HTTP 422 xxx")


@pytest.mark.parametrize("seconds_left", [0, -1, -3600])
def test_agent_drops_a_request_already_past_its_deadline(seconds_left: float) -> None:
    agent, remote, transport = make_agent(ok())

    assert agent.handle(make_request(seconds_left=seconds_left)) is AgentOutcome.TOO_LATE
    assert remote.seen == []
    assert transport.replies == []


def test_agent_sends_nothing_when_the_call_finishes_after_the_deadline() -> None:
    clock = FakeClock()

    def slow(request: httpx.Request) -> httpx.Response:
        clock.advance(31)
        return ok()

    remote = Remote(clock, slow)
    client, _ = make_client(remote)
    transport = RecordingTransport()

    assert Agent(client, transport, clock).handle(make_request(30)) is AgentOutcome.TOO_LATE
    assert len(remote.seen) == 1
    assert transport.replies == []


def test_agent_sends_nothing_when_a_permanent_failure_comes_after_the_deadline() -> None:
    clock = FakeClock()

    def slow_refusal(request: httpx.Request) -> httpx.Response:
        clock.advance(30)
        return status(400, error="bad")

    client, _ = make_client(Remote(clock, slow_refusal))
    transport = RecordingTransport()

    assert Agent(client, transport, clock).handle(make_request(30)) is AgentOutcome.TOO_LATE
    assert transport.replies == []


def test_agent_sends_nothing_when_time_runs_out_on_transient_failures() -> None:
    agent, remote, transport = make_agent(status(503))

    assert agent.handle(make_request(seconds_left=4)) is AgentOutcome.TOO_LATE
    assert len(remote.seen) >= 2
    assert transport.replies == []


def test_agent_reports_too_late_when_the_transport_refuses_the_reply() -> None:
    agent, _, transport = make_agent(ok(), accept=False)

    assert agent.handle(make_request()) is AgentOutcome.TOO_LATE
    assert len(transport.replies) == 1
